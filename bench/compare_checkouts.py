"""Acting throughput of two checkouts side by side: before/after a change, in one run.

    .venv/bin/python bench/compare_checkouts.py --before /path/to/old/checkout \\
        --configs catch:8:1,catch:2:16 --modes shm,central --rounds 2 --out acting_trust

Runs `bench/acting.py` of each checkout in turn (before, after, before, after, ...; the
same venv, each checkout's own code on `PYTHONPATH`), so both see the same machine and
load drift, and prints per configuration and mode the median rate of each and the
ratio after/before. Writes bench/results/<out>.json (every round's rows, with the
load at each run's end). A change costs nothing measurable when the ratio sits within
the spread of the rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from harness import machine, print_table, write_json

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_acting(checkout: str, args) -> list:
  """`bench/acting.py` of `checkout` (its own code); the rows it wrote."""
  env = dict(os.environ, PYTHONPATH=checkout)
  cmd = [sys.executable, os.path.join(checkout, 'bench', 'acting.py'), '--configs',
         args.configs, '--modes', args.modes, '--seconds', str(args.seconds)]
  result = subprocess.run(cmd, cwd=checkout, env=env, text=True, capture_output=True)
  print(result.stdout[-1500:], flush=True)
  if result.returncode != 0:
    raise RuntimeError(f'acting.py in {checkout} failed: {result.stderr[-2000:]}')
  path = os.path.join(checkout, 'bench', 'results', 'acting.json')
  with open(path) as f:
    rows = json.load(f)['rows']
  os.remove(path)
  return rows


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--before', required=True, help='the other checkout (e.g. a '
                      '`git worktree add` of the commit before the change)')
  parser.add_argument('--configs', default='catch:8:1,catch:2:16')
  parser.add_argument('--modes', default='shm,central')
  parser.add_argument('--seconds', type=float, default=35.0)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--out', default='acting_checkouts')
  args = parser.parse_args()
  before = os.path.abspath(args.before)
  runs = []
  for r in range(args.rounds):
    for label, checkout in (('before', before), ('after', HERE)):
      for row in run_acting(checkout, args):
        runs.append(dict(row, checkout=label, round=r))
  table = []
  for config in args.configs.split(','):
    env, actors, k = config.split(':')
    for mode in args.modes.split(','):
      rates = {label: [x[f'{mode}_per_s'] for x in runs if x['checkout'] == label
                       and x['actors'] == int(actors) and x['K'] == int(k)]
               for label in ('before', 'after')}
      loads = [x[f'{mode}_load_1m'] for x in runs
               if x['actors'] == int(actors) and x['K'] == int(k)]
      table.append({'env': env, 'actors': int(actors), 'K': int(k), 'mode': mode,
                    'before_per_s': statistics.median(rates['before']),
                    'after_per_s': statistics.median(rates['after']),
                    'after_vs_before': statistics.median(rates['after'])
                    / statistics.median(rates['before']),
                    'before_runs': rates['before'], 'after_runs': rates['after'],
                    'load_1m': f'{min(loads):.1f}-{max(loads):.1f}'})
  print_table(table, ['env', 'actors', 'K', 'mode', 'before_per_s', 'after_per_s',
                      'after_vs_before', 'load_1m'])
  commit = lambda c: subprocess.run(['git', '-C', c, 'rev-parse', '--short', 'HEAD'],  # noqa: E731
                                    capture_output=True, text=True).stdout.strip()
  path = write_json(f'{args.out}.json', {
      'machine': machine(), 'before': commit(before), 'after': commit(HERE),
      'configs': args.configs, 'modes': args.modes, 'seconds_per_run': args.seconds,
      'rounds': args.rounds, 'table': table, 'runs': runs})
  print(f'compare_checkouts: wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
