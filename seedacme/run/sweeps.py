"""A seed sweep's logdirs (`<logdir>/seed_<n>/`) as one table: median and range.

    python -m seedacme.launchers.slurm aggregate <logdir>    # or: python -m seedacme.run.sweeps

The form of the published tables here (median and range over seeds at fixed env steps,
and the curves): each seed's return at a point is its last record at or before those
env steps, so a seed that reports every 5 s and one that reports every 30 s are read
alike. A median, min and max are given only where every seed has a value: the points
run up to the env steps every seed reached, and a point before some seed's first record
shows '-' (a run whose first record came later, because it started later or more
slowly, would otherwise leave a one-seed median at the start). Training averages over
a partial window after a resume are left out, as the curves leave them out
(`curves.full_windows`). Writes `aggregate.json` and `aggregate.png` beside the seeds.
"""

import argparse
import json
import math
import os
import re
import sys
from typing import Dict, List, Sequence, Tuple

from seedacme.run import logdir as logdir_lib
from seedacme.run.curves import full_windows


def seed_dirs(logdir: str) -> Dict[int, str]:
  out = {}
  for name in sorted(os.listdir(logdir)):
    m = re.fullmatch(r'seed_(\d+)', name)
    if m and os.path.isdir(os.path.join(logdir, name)):
      out[int(m.group(1))] = os.path.join(logdir, name)
  return out


def seed_curve(records: Sequence[Dict], metric: str) -> List[Tuple[int, float]]:
  """(env steps, return) of one seed's records; training averages over a partial window
  after a resume left out (`seedacme.run.curves.full_windows`)."""
  records = [r for r in records if 'event' not in r and r.get('env_steps') is not None]
  full = full_windows(records) if metric == 'average_return' else [True] * len(records)
  return [(int(r['env_steps']), float(r[metric])) for r, ok in zip(records, full)
          if ok and r.get(metric) is not None]


def value_at(curve: Sequence[Tuple[int, float]], env_steps: int) -> float | None:
  """The seed's return by `env_steps`: its last record at or before them."""
  value = None
  for steps, ret in curve:
    if steps > env_steps:
      break
    value = ret
  return value


def aggregate(curves: Dict[int, List[Tuple[int, float]]], points: int = 10,
              every: int = 0) -> Dict:
  """Median and range over seeds at fixed env steps: every `every` steps, or `points`
  evenly spaced, up to the env steps every seed reached; None where a seed has no record
  yet (its `seeds` count says how many had)."""
  reached = min((c[-1][0] for c in curves.values() if c), default=0)
  if every:
    steps = list(range(every, reached + 1, every))
  else:
    step = max(1, reached // points) if reached else 0
    steps = [step * (i + 1) for i in range(points)] if step else []
    if step:  # rounded to a readable number of steps
      unit = 10 ** max(0, int(math.log10(step)) - 1)
      steps = [max(unit, round(s / unit) * unit) for s in steps]
      steps = [s for s in steps if s <= reached]
  rows = []
  for s in steps:
    values = {seed: value_at(c, s) for seed, c in curves.items()}
    have = sorted(v for v in values.values() if v is not None)
    every_seed = bool(have) and len(have) == len(curves)
    rows.append({'env_steps': s, 'seeds': len(have),
                 'median': _median(have) if every_seed else None,
                 'min': have[0] if every_seed else None,
                 'max': have[-1] if every_seed else None,
                 'per_seed': {str(k): v for k, v in values.items()}})
  finals = {str(seed): (c[-1][1] if c else None) for seed, c in curves.items()}
  return {'seeds': sorted(curves), 'env_steps_every_seed_reached': reached,
          'points': rows, 'final': finals}


def _median(values: Sequence[float]) -> float | None:
  if not values:
    return None
  n = len(values)
  return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def format_table(result: Dict, metric: str) -> str:
  lines = [f'{metric} over seeds {result["seeds"]}: median [min, max] at env steps',
           f'{"env_steps":>12} {"median":>9} {"min":>9} {"max":>9} seeds']
  for row in result['points']:
    f = lambda v: f'{v:9.3f}' if v is not None else f'{"-":>9}'  # noqa: E731
    lines.append(f'{row["env_steps"]:>12} {f(row["median"])} {f(row["min"])} '
                 f'{f(row["max"])} {row["seeds"]:>5}')
  return '\n'.join(lines)


def plot(curves: Dict[int, List[Tuple[int, float]]], result: Dict, metric: str,
         path: str, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4))
  for seed, curve in curves.items():
    if curve:
      ax.plot(*zip(*curve), linewidth=0.6, alpha=0.4, label=f'seed {seed}')
  rows = [r for r in result['points'] if r['median'] is not None]
  if rows:
    xs = [r['env_steps'] for r in rows]
    ax.fill_between(xs, [r['min'] for r in rows], [r['max'] for r in rows], alpha=0.2,
                    label='range')
    ax.plot(xs, [r['median'] for r in rows], 'o-', color='black', label='median')
  ax.set_xlabel('env steps')
  ax.set_ylabel(metric)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='launchers/slurm aggregate',
                              description='a seed sweep: median and range at fixed env steps')
  p.add_argument('logdir', help='the --logdir of the sweep (holding seed_<n>/)')
  p.add_argument('--metric', default='eval_average_return',
                 choices=('eval_average_return', 'average_return'))
  p.add_argument('--points', type=int, default=10)
  p.add_argument('--every', type=int, default=0, help='env steps between points '
                 '(default: --points evenly spaced)')
  args = p.parse_args(argv)
  dirs = seed_dirs(args.logdir)
  if not dirs:
    print(f'aggregate: no seed_<n> directories in {args.logdir}', file=sys.stderr)
    return 1
  curves = {}
  for seed, path in dirs.items():
    try:
      curves[seed] = seed_curve(logdir_lib.read_progress(path), args.metric)
    except (OSError, ValueError):
      curves[seed] = []
  result = aggregate(curves, args.points, args.every)
  result['metric'] = args.metric
  print(format_table(result, args.metric))
  out = os.path.join(args.logdir, 'aggregate.json')
  with open(out, 'w') as f:
    json.dump(result, f, indent=1)
  png = os.path.join(args.logdir, 'aggregate.png')
  plot(curves, result, args.metric, png, os.path.basename(args.logdir.rstrip('/')))
  print(f'aggregate: {out}, {png}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
