"""Acting throughput: central (SEED) vs actor-side (Acme) inference, side by side.

    .venv/bin/python bench/acting.py            # Catch and Pong, ~15 minutes
    .venv/bin/python bench/acting.py --quick    # Catch, 2 actors, ~2 minutes (CI smoke)

For every configuration (env, actor processes, envs per actor K) the same program runs
three times with `--acting_only` (no learner, no trajectories: the learner would
otherwise set the pace) and no evaluator: central inference with its requests over
Courier (`central_*`, `--transport courier`), central inference over shared memory
(`shm_*`, `--transport shm`: the default on one host), and actor-side inference
(`actor_*`). Also measured in the same run:
the raw env ceiling, the same envs in the same number of processes stepping random
actions with no inference at all (the same engine: ale-py's C++ vector env for Pong).
Pong serves SEED's IMPALA ResNet torso.

Also per row: CPU microseconds per env step of the actor nodes and of the central node
(user + system of all their processes, over the same steady window as the rate): with
every core busy, the mode that spends less CPU per env step serves more env steps.

Prints the tables and writes bench/results/acting[_quick].json. Asserts nothing about
speed: it reports.
"""

import argparse
import sys
import time

from harness import ProgramRun, env_ceiling, machine, print_table, write_json

# Frames per env step: Atari repeats each action 4 times.
FRAMES_PER_STEP = {'catch': 1, 'atari': 4}
# How actors step their K envs: Atari with ale-py's C++ vector engine (envs/atari_vector.py).
ENGINES = {'catch': 'python', 'atari': 'vector_sync'}


def configs(quick: bool):
  if quick:
    return [('catch', 2, 16)]
  return [('catch', 8, 1), ('catch', 16, 1), ('catch', 2, 1), ('catch', 2, 16),
          ('catch', 2, 64), ('catch', 4, 16), ('atari', 2, 16), ('atari', 4, 16)]


# Runs per configuration: (row prefix, program flags). `central` keeps its published
# meaning (requests over Courier); `shm` is central inference over shared memory.
MODES = (('central', ['--inference', 'central', '--transport', 'courier']),
         ('shm', ['--inference', 'central', '--transport', 'shm']),
         ('actor', ['--inference', 'actor']))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--seconds', type=float, default=None,
                      help='program budget per run (default 35; quick 15)')
  parser.add_argument('--only', default=None, help="'catch' or 'atari'")
  parser.add_argument('--modes', default=None,
                      help="comma-separated subset of 'central,shm,actor' (default: all)")
  parser.add_argument('--configs', default=None,
                      help="e.g. 'catch:2:1,atari:2:16' (default: all of configs())")
  args = parser.parse_args()
  seconds = args.seconds or (15.0 if args.quick else 35.0)
  rows = []
  chosen = configs(args.quick) if not args.configs else [
      (e, int(a), int(k)) for e, a, k in (c.split(':') for c in args.configs.split(','))]
  for env, actors, k in chosen:
    if args.only and env != args.only:
      continue
    engine = ENGINES[env]
    extra = ['--agent_config', 'torso=impala_resnet'] if env == 'atari' else []
    extra += ['--env_engine', engine]
    row = {'env': 'pong' if env == 'atari' else env, 'actors': actors, 'K': k,
           'engine': engine}
    for mode, flags in MODES:
      if args.modes and mode not in args.modes.split(','):
        continue
      run = ProgramRun([env, 'vtrace', str(actors), str(k), *flags,
                        '--acting_only', '--num_eval_envs', '0',
                        '--max_seconds', str(seconds), *extra], f'{env}_{mode}')
      started = time.monotonic()
      result = run.run(timeout_s=seconds + 150)
      rate = run.steady_rate('env_steps') * FRAMES_PER_STEP[env]
      row[f'{mode}_per_s'] = rate
      row[f'{mode}_actor_rss_mb'] = run.node_rss('actor')
      row[f'{mode}_learner_rss_mb'] = run.node_rss('learner')
      row[f'{mode}_exit'] = result['exit_code']
      row[f'{mode}_load_1m'] = result['load_1m_at_end']  # other work skews the numbers
      # Where the CPU goes per env step: the actors' nodes and the central node's.
      for group in ('actor', 'learner'):
        row[f'{mode}_{group}_cpu_us_per_step'] = run.cpu_us_per_step(group)
      print(f'acting: {env} {actors}x{k} {mode}: {rate:,.0f} '
            f'{"frames" if env == "atari" else "steps"}/s (exit {result["exit_code"]}, '
            f'{time.monotonic() - started:.0f}s, logdir {run.logdir})', flush=True)
    row['ceiling_per_s'] = env_ceiling(env, actors, k, seconds=3.0 if args.quick else 8.0,
                                       engine=engine) * FRAMES_PER_STEP[env]
    ran = [m for m, _ in MODES if f'{m}_per_s' in row]
    for mode in ran:
      row[f'{mode}_cpu_us_per_step'] = (row[f'{mode}_actor_cpu_us_per_step']
                                        + row[f'{mode}_learner_cpu_us_per_step'])
      row[f'{mode}_of_ceiling'] = row[f'{mode}_per_s'] / row['ceiling_per_s']
    for a, b in (('central', 'actor'), ('shm', 'actor'), ('shm', 'central')):
      if a in ran and b in ran:
        row[f'{a}_vs_{b}'] = row[f'{a}_per_s'] / row[f'{b}_per_s']
    rows.append(row)
  print('\nenv steps/s (Catch) or frames/s (Pong); RSS of the largest actor node '
        '(supervisor + child) in MB')
  print_table(rows, ['env', 'actors', 'K', 'engine', 'central_per_s', 'shm_per_s',
                     'actor_per_s', 'central_vs_actor', 'shm_vs_actor', 'shm_vs_central',
                     'ceiling_per_s', 'shm_of_ceiling', 'shm_actor_rss_mb',
                     'actor_actor_rss_mb'])
  print('\nCPU microseconds per env step (user + system, all processes of the node type):'
        ' actor nodes + central node = total')
  print_table(rows, ['env', 'actors', 'K', 'central_actor_cpu_us_per_step',
                     'central_learner_cpu_us_per_step', 'central_cpu_us_per_step',
                     'shm_actor_cpu_us_per_step', 'shm_learner_cpu_us_per_step',
                     'shm_cpu_us_per_step', 'actor_actor_cpu_us_per_step',
                     'actor_learner_cpu_us_per_step', 'actor_cpu_us_per_step'])
  path = write_json('acting_quick.json' if args.quick else 'acting.json',
                    {'machine': machine(), 'seconds_per_run': seconds, 'rows': rows})
  print(f'acting: wrote {path}')
  failed = [r for r in rows if any(r.get(f'{m}_exit') for m, _ in MODES)]
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
