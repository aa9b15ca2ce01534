"""Time to solve, startup and memory: central (SEED) vs actor-side (Acme) inference.

    .venv/bin/python bench/time_to_solve.py           # Catch and CartPole, V-trace and
                                                      # R2D2, both modes (~25 minutes)
    .venv/bin/python bench/time_to_solve.py --quick   # Catch V-trace, both modes (CI)

Every run is a full training program (`run_local <env> <agent> 2`, 16 envs per actor,
a greedy evaluator) that stops itself once the evaluator's average return over its last
20 episodes reaches the target (Catch 0.9, CartPole 475) or at the time cap. One more
row is Acme's usual setting, one env per actor (`run_local catch vtrace 2 1`, the
agent's defaults for that size), stopped on the training average (last 100 episodes). Reported
per run: seconds to the target on the program's clock, env steps used, startup (launch
to the first learner step, wall clock, 1 s resolution), peak RSS per node type and of
the whole program. Prints a table, writes bench/results/time_to_solve[_quick].json.

Times to target vary a lot between seeds (R2D2 CartPole: 30-134 s over 6 seeds at the
same settings), so compare settings with `--seeds` and medians, never one run.
"""

import argparse
import shlex
import sys

from harness import ProgramRun, machine, print_table, write_json

from seedacme.config import ProgramConfig

TARGETS = {'catch': 0.9, 'cartpole': 475.0}
CAPS_S = {'catch': 150.0, 'cartpole': 360.0}
GROUPS = ('actor', 'evaluator', 'learner', 'replay')


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--out', default=None, help='JSON name under bench/results '
                      '(default time_to_solve[_quick].json)')
  parser.add_argument('--only', default=None, help='e.g. catch, cartpole, r2d2, vtrace')
  parser.add_argument('--modes', default='central,actor',
                      help="inference modes to run, comma-separated: central (requests "
                      "through shared memory on this host, the default transport), "
                      "courier (central, requests over Courier), actor")
  parser.add_argument('--envs_per_actor', type=int, default=None,
                      help='only the runs with this K')
  parser.add_argument('--runs', default=None,
                      help="instead of the default list, e.g. 'catch:vtrace:1:train,"
                      "cartpole:r2d2:16:eval:central' (env:agent:K:target_on[:modes+"
                      "[:eval_envs]]; eval_envs: the evaluator's envs, default the "
                      "program's)")
  parser.add_argument('--agent_config', action='append', default=[], metavar='FIELD=VALUE',
                      help="passed to every run's program (a hyperparameter study)")
  parser.add_argument('--cap_s', type=float, default=None,
                      help="each run's time cap (default per env: Catch 150 s, CartPole 360 s)")
  parser.add_argument('--seeds', default='0', help='program seeds, comma-separated: '
                      'every run once per seed')
  parser.add_argument('--setting', action='append', default=[], metavar='NAME=ARGS',
                      help="settings compared side by side: a name and the run_local "
                      "arguments it adds, e.g. --setting base= --setting fast='--acting_nice "
                      "10'; each run goes once per seed and setting, settings alternating "
                      "within a seed so drift in the load favours none")
  args = parser.parse_args()
  settings = [(v.split('=', 1)[0], shlex.split(v.split('=', 1)[1] if '=' in v else ''))
              for v in args.setting] or [(None, [])]
  # (env, agent, envs per actor, what the target watches)
  runs = [('catch', 'vtrace', 16, 'eval')] if args.quick else [
      ('catch', 'vtrace', 16, 'eval'), ('catch', 'vtrace', 1, 'train'),
      ('catch', 'r2d2', 16, 'eval'), ('cartpole', 'vtrace', 16, 'eval'),
      ('cartpole', 'r2d2', 16, 'eval')]
  # (env, agent, K, target_on, the evaluator's envs or None, modes)
  runs = [run + (None, args.modes.split(',')) for run in runs]
  if args.runs:
    runs = []
    for spec in args.runs.split(','):
      env, agent, k, target_on, *rest = spec.split(':')
      eval_envs = int(rest[1]) if len(rest) > 1 else None
      modes = rest[0].split('+') if rest and rest[0] else args.modes.split(',')
      runs.append((env, agent, int(k), target_on, eval_envs, modes))
  rows = []
  for env, agent, k, target_on, eval_envs, modes in runs:
    if args.only and args.only not in (env, agent):
      continue
    if args.envs_per_actor and k != args.envs_per_actor:
      continue
    cap = args.cap_s or (90.0 if args.quick else CAPS_S[env])
    for mode, seed, (setting, setting_args) in [
        (m, int(s), st) for m in modes for s in args.seeds.split(',') for st in settings]:
      extra = [] if eval_envs is None else ['--num_eval_envs', str(eval_envs)]
      extra += [f'--agent_config={c}' for c in args.agent_config] + setting_args
      extra += ['--seed', str(seed)] if seed else []
      flags = {'central': ['--inference', 'central'],
               'courier': ['--inference', 'central', '--transport', 'courier'],
               'actor': ['--inference', 'actor']}[mode]
      run = ProgramRun([env, agent, '2', str(k), *flags,
                        '--target_return', str(TARGETS[env]), '--target_on', target_on,
                        '--max_seconds', str(cap)] + extra, f'{env}_{agent}_{k}_{mode}')
      result = run.run(timeout_s=cap + 150)
      summary = result['summary']
      solved = (summary.get('stop') or {}).get('kind') in ('target', 'eval_target')
      row = {'env': env, 'agent': agent, 'inference': 'actor' if mode == 'actor' else 'central',
             'transport': {'central': 'auto', 'courier': 'courier', 'actor': '-'}[mode],
             'exit': result['exit_code'],
             'K': k, 'target_on': target_on, 'seed': seed,
             'agent_config': ' '.join(args.agent_config) or 'defaults',
             'setting': setting, 'setting_args': ' '.join(setting_args),
             'num_eval_envs': eval_envs if eval_envs is not None else ProgramConfig.num_eval_envs,
             'train_env_steps_per_s': (summary['env_steps'] / summary['elapsed_s']
                                       if summary.get('elapsed_s') else None),
             'train_return': summary.get('average_return'),
             'solved': solved,
             'time_to_target_s': summary.get('elapsed_s') if solved else None,
             'env_steps': summary.get('env_steps'),
             'learner_steps': summary.get('learner_steps'),
             'eval_return': summary.get('eval_average_return'),
             'startup_to_first_learner_step_s': run.first_learner_step_s,
             'startup_to_first_env_step_s': run.first_env_step_s,
             'program_peak_rss_mb': run.peak_total_rss,
             'leftover_processes': len(result['leftovers']),
             'load_1m_at_end': result['load_1m_at_end']}
      row.update({f'{g}_rss_mb': run.node_rss(g) for g in GROUPS})
      row['counter_rss_mb'] = None  # published field; the counter node is gone
      rows.append(row)
      outcome = f"solved in {row['time_to_target_s']:.0f}s" if solved else 'not solved'
      print(f"time_to_solve: {env} {agent} {mode} seed {seed} {setting or ''}: {outcome} "
            f"({summary.get('stopped_because')}); startup {run.first_learner_step_s}s; "
            f"logdir {run.logdir}", flush=True)
  print()
  print_table(rows, ['env', 'agent', 'K', 'num_eval_envs', 'target_on', 'inference',
                     'transport', 'seed', 'agent_config', 'setting',
                     'time_to_target_s', 'env_steps', 'train_env_steps_per_s',
                     'startup_to_first_learner_step_s', 'actor_rss_mb', 'learner_rss_mb',
                     'replay_rss_mb', 'program_peak_rss_mb'])
  path = write_json(args.out or ('time_to_solve_quick.json' if args.quick
                                 else 'time_to_solve.json'),
                    {'machine': machine(), 'targets': TARGETS, 'rows': rows})
  print(f'time_to_solve: wrote {path}')
  return 1 if any(r['exit'] or r['leftover_processes'] for r in rows) else 0


if __name__ == '__main__':
  sys.exit(main())
