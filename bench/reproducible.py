"""The reproducible schedule's cost, side by side (issue 63, Deliver 5): today's schedule
vs `--reproducible` (lag 0) vs `--reproducible --reproducible_lag 1`, in one run.

    .venv/bin/python bench/reproducible.py                  # Catch V-trace 2 x 16 and
                                                            # CartPole PPO 2 x 8, 2 seeds
    .venv/bin/python bench/reproducible.py --suites hopper,pong --seeds 0,1   # the long ones

Every run is a full training program (`run_local`, the launcher's defaults, its greedy
evaluator included). Catch and CartPole stop at the README's target (Catch 0.9, CartPole
475, on the evaluator's last 20 episodes) or at the cap; Hopper PPO at 100k env steps;
Pong V-trace after 10 minutes. Per run: env steps/s over the program's own clock (the
summary's env steps over its elapsed seconds: what a budget in seconds buys), seconds
and env steps to the target, the final returns, how long a reproducible run's rounds
waited for the learner (`round_learner_wait_s`: acting idle, the schedule's cost), and
the machine's 1-minute load before and after.

`--modes default,lockstep,...` adds today's schedule with a round's batching only
(`--inference_batch_envs N`: every inference batch waits for all N training envs),
which tells the cost of a round's batching from that of the version barrier.

Why the order: modes alternate within a seed and the first mode rotates between seeds,
so drift in the machine's load (2 cores shared with other work) favours no mode; each
suite's ratios (a mode's median over today's) are over the same seeds. Prints a table,
writes bench/results/<out>.json (copy it to bench/published/ to publish).
"""

import argparse
import os
import statistics
import sys
import time

from harness import ProgramRun, commit, machine, print_table, write_json

# name: (run_local arguments, cap in seconds, what ends the run)
SUITES = {
    'catch': (['catch', 'vtrace', '2', '16', '--target_return', '0.9', '--target_on', 'eval'],
              150.0, 'greedy 0.9 (time to target)'),
    'cartpole': (['cartpole', 'ppo', '2', '8', '--target_return', '475', '--target_on',
                  'eval'], 150.0, 'greedy 475 (time to target)'),
    'hopper': (['mujoco', 'ppo', '2', '8', '--level', 'Hopper-v5', '--max_env_steps',
                '100000'], 900.0, '100k env steps'),
    'pong': (['atari', 'vtrace', '2', '16', '--game', 'Pong', '--env_engine', 'vector_sync'],
             600.0, '10 minutes'),
}
MODES = {
    'default': [],
    'reproducible_lag0': ['--reproducible'],
    'reproducible_lag1': ['--reproducible', '--reproducible_lag', '1'],
}
# Not in the default list: today's schedule with a round's batching only (every
# inference batch waits for all N training envs, as a reproducible round's does; no
# version barrier, no op determinism), to tell the two costs apart.
LOCKSTEP = 'lockstep'
HOW_TO_RUN = '.venv/bin/python bench/reproducible.py --suites {suites} --seeds 0,1'


def _median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _ratio(a, b):
  return a / b if a is not None and b else None


def run_one(suite: str, mode: str, seed: int) -> dict:
  args, cap, _ = SUITES[suite]
  budget = ['--max_seconds', str(cap)]
  flags = MODES.get(mode, [])
  if mode == LOCKSTEP:  # N: num_actors x envs_per_actor of the suite
    flags = ['--inference_batch_envs', str(int(args[2]) * int(args[3]))]
  run = ProgramRun([*args, *flags, '--seed', str(seed), *budget],
                   f'reproducible_{suite}_{mode}')
  load_before = os.getloadavg()[0]
  result = run.run(timeout_s=cap + 180)
  s = result['summary']
  kind = (s.get('stop') or {}).get('kind')
  solved = kind in ('target', 'eval_target')
  elapsed = s.get('elapsed_s')
  row = {'suite': suite, 'mode': mode, 'seed': seed, 'exit': result['exit_code'],
         'stopped': kind,
         'env_steps_per_s': s['env_steps'] / elapsed if elapsed else None,
         'time_to_target_s': elapsed if solved else None,
         'env_steps': s.get('env_steps'), 'learner_steps': s.get('learner_steps'),
         'elapsed_s': elapsed, 'train_return': s.get('average_return'),
         'eval_return': s.get('eval_average_return'),
         'round_learner_wait_s': s.get('round_learner_wait_s'),
         'last_round': s.get('last_round'),
         'exact_until_round': s.get('exact_until_round'),
         'weights_sha256': s.get('weights_sha256'),
         'startup_to_first_learner_step_s': run.first_learner_step_s,
         'load_1m_before': round(load_before, 2),
         'load_1m_at_end': round(result['load_1m_at_end'], 2),
         'leftover_processes': len(result['leftovers'])}
  print(f"reproducible: {suite} {mode} seed {seed}: {s.get('stopped_because')}; "
        f"{row['env_steps_per_s'] or float('nan'):,.0f} env steps/s; load "
        f"{row['load_1m_before']} -> {row['load_1m_at_end']}", flush=True)
  return row


def summarize(rows, suites):
  """Per suite and mode: medians over seeds, and ratios to today's schedule (of the
  medians, and paired by seed: the same seed's runs ran next to each other)."""
  out = []
  for suite in suites:
    base = [r for r in rows if r['suite'] == suite and r['mode'] == 'default']
    for mode in [*MODES, LOCKSTEP]:
      mine = [r for r in rows if r['suite'] == suite and r['mode'] == mode]
      if not mine:
        continue
      rate = _median([r['env_steps_per_s'] for r in mine])
      time_s = _median([r['time_to_target_s'] for r in mine])
      paired = [_ratio(r['env_steps_per_s'], b['env_steps_per_s'])
                for r in mine for b in base if b['seed'] == r['seed']]
      out.append({
          'suite': suite, 'mode': mode, 'runs': len(mine),
          'solved': sum(r['time_to_target_s'] is not None for r in mine),
          'env_steps_per_s': rate,
          'rate_vs_default': _ratio(rate, _median([b['env_steps_per_s'] for b in base])),
          'rate_vs_default_paired': [round(p, 3) for p in paired if p is not None],
          'time_to_target_s': time_s,
          'time_vs_default': _ratio(time_s, _median([b['time_to_target_s'] for b in base])),
          'env_steps': _median([r['env_steps'] for r in mine]),
          'round_learner_wait_s': _median([r['round_learner_wait_s'] for r in mine]),
          'learner_wait_share': _median([
              r['round_learner_wait_s'] / r['elapsed_s']
              for r in mine if r['round_learner_wait_s'] is not None and r['elapsed_s']]),
          'eval_return': _median([r['eval_return'] for r in mine]),
          'train_return': _median([r['train_return'] for r in mine]),
      })
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--suites', default='catch,cartpole',
                      help=f'comma-separated, of {", ".join(SUITES)}')
  parser.add_argument('--seeds', default='0,1', help='one repeat of every mode per seed')
  parser.add_argument('--modes', default=','.join(MODES),
                      help=f'of {", ".join(MODES)} and {LOCKSTEP} (a round\'s batching '
                      'without the rest of the schedule)')
  parser.add_argument('--out', default='reproducible_cost.json')
  args = parser.parse_args()
  suites = [s for s in args.suites.split(',') if s]
  modes = [m for m in args.modes.split(',') if m]
  for name in suites + modes:
    if name not in SUITES and name not in MODES and name != LOCKSTEP:
      parser.error(f'unknown suite or mode {name!r}')
  seeds = [int(s) for s in args.seeds.split(',')]
  started = time.time()
  rows = []
  for i, seed in enumerate(seeds):
    for suite in suites:
      order = modes[i % len(modes):] + modes[:i % len(modes)]  # rotates per seed
      for mode in order:
        rows.append(run_one(suite, mode, seed))
  table = summarize(rows, suites)
  print()
  print_table(rows, ['suite', 'mode', 'seed', 'stopped', 'env_steps_per_s',
                     'time_to_target_s', 'env_steps', 'eval_return',
                     'round_learner_wait_s', 'load_1m_before', 'load_1m_at_end'])
  print()
  print_table(table, ['suite', 'mode', 'runs', 'solved', 'env_steps_per_s',
                      'rate_vs_default', 'time_to_target_s', 'time_vs_default',
                      'learner_wait_share'])
  skipped = [s for s in SUITES if s not in suites]
  payload = {
      'command': ' '.join([os.path.relpath(sys.executable, os.getcwd())
                           if sys.executable.startswith(os.getcwd()) else sys.executable,
                           'bench/reproducible.py', *sys.argv[1:]]),
      **commit(), 'machine': machine(), 'minutes': round((time.time() - started) / 60, 1),
      'suites': {s: {'run_local': ' '.join(SUITES[s][0]), 'cap_s': SUITES[s][1],
                     'ends_at': SUITES[s][2]} for s in suites},
      'modes': {m: ' '.join(MODES[m]) if m in MODES else
                '--inference_batch_envs N (N: the training envs)' for m in modes},
      'not_measured': {s: {'run_local': ' '.join(SUITES[s][0]), 'ends_at': SUITES[s][2],
                           'command': HOW_TO_RUN.format(suites=s)} for s in skipped},
      'summary': table, 'rows': rows}
  path = write_json(args.out, payload)
  print(f'reproducible: wrote {path}')
  return 1 if any(r['exit'] or r['leftover_processes'] for r in rows) else 0


if __name__ == '__main__':
  sys.exit(main())
