"""Learning curves from `<logdir>/progress.jsonl`: a CSV table and a PNG plot in the
logdir, and the curve at fixed env-step points that a published result's JSON holds.

The logdir may be remote (`gs://...` on Vertex AI): files go through `tf.io.gfile`
there, and through plain `open` for local paths, so that a launcher drawing the curves
of a local run does not import TensorFlow.
"""

import csv
import io
import os
from typing import Any, Dict, List, Sequence

from seedacme.run.accounting import WINDOWS

from seedacme.types import Mode
from seedacme.run.logdir import open_file, read_progress


COLUMNS = ('env_steps', 'elapsed_s', 'learner_steps', 'average_return',
           'eval_average_return', 'env_steps_per_s', 'learner_steps_per_s')


def full_windows(records: Sequence[Dict[str, Any]],
                 window: int = WINDOWS[Mode.TRAIN]) -> List[bool]:
  """Per record: whether its training average covers the full window of `window`
  episodes (or every episode so far, early in a fresh run).

  A resumed run restores its episode count but its average starts over, and the first
  episodes to end after a restart are the shortest (in Pong the most one-sided: 3 of
  them averaged +20 where the run stood at +7). Records carry `average_over` since the
  monitor reports it; for older ones the episodes since their segment's start (the
  clock starts again at 0 on resume) stand in for it.
  """
  out, base, previous = [], 0, None
  for r in records:
    if previous is not None and r['elapsed_s'] < previous['elapsed_s']:
      base = previous.get('episodes') or 0  # a resumed segment starts here
    episodes = r.get('episodes') or 0
    covered = r.get('average_over', episodes - base)
    out.append(covered >= min(window, episodes))
    previous = r
  return out


# Published curves hold this many points per run at most: enough to redraw the picture
# and to read a return at any budget, small enough that a result stays one small JSON.
CURVE_POINTS = 100


def curve_step(max_env_steps: int, points: int = CURVE_POINTS) -> int:
  """The fixed env-step spacing of a published curve: the smallest 1, 2, 2.5 or 5 x 10^k
  with at most `points` points up to `max_env_steps` (1M -> 10k, 300k -> 5k)."""
  scale = 1
  while True:
    for m in (1, 2, 2.5, 5):
      if m * scale * points >= max_env_steps:
        return int(m * scale)
    scale *= 10


def at_env_steps(points: Sequence[Sequence[Any]], every: int) -> Dict[str, list]:
  """A run's curve at fixed env-step points `every`, `2 * every`, ... up to its last
  record: per point the first of `points` ((env steps, training average, evaluator
  average) in record order) at or past it, as the bench marks read a return at 1M.
  The training average is None where that record's window was not full (pass None for
  those: `full_windows`); values rounded to 2 decimals."""
  out: Dict[str, list] = {'env_steps': [], 'average_return': [], 'eval_return': []}
  if not points:
    return out
  last = max(p[0] for p in points)
  i = 0
  for mark in range(every, last + 1, every):
    while i < len(points) and points[i][0] < mark:
      i += 1
    if i == len(points):
      break
    _, average, evaluated = points[i]
    out['env_steps'].append(mark)
    out['average_return'].append(None if average is None else round(average, 2))
    out['eval_return'].append(None if evaluated is None else round(evaluated, 2))
  return out


def published_curve(records: Sequence[Dict[str, Any]], every: int) -> Dict[str, list]:
  """`at_env_steps` of a run's progress records: training averages over a full window
  only (a resumed segment's refilling window is None), the evaluator's as recorded."""
  return at_env_steps([(r['env_steps'], r.get('average_return') if ok else None,
                        r.get('eval_average_return'))
                       for r, ok in zip(records, full_windows(records))], every)


SEED_CURVES_WHAT = (
    "per run: the training average (last 100 episodes; null where a resumed segment's "
    "window was not yet full) and the greedy evaluator's average, at the first progress "
    "record at or past each env-step point")


def seed_curves(every: int, runs: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """A published JSON's `seed_curves`: each run (name, task, agent, seed, and its
  `at_env_steps` lists) sampled every `every` env steps, with what the values are."""
  return {'every_env_steps': every, 'what': SEED_CURVES_WHAT, 'runs': list(runs)}


def curve_title(agent: str, env: str, task: str | None = None) -> str:
  """A plot's title: 'vtrace on atari: Pong' -- the agent, the env and the level, game
  or scenario it ran (`task`; None for envs with one task, e.g. 'vtrace on catch').
  Without the task, curves of different games of one env read the same."""
  return f'{agent} on {env}' + (f': {task}' if task else '')


def write_curves(logdir: str, title: str = '') -> Dict[str, str]:
  """Writes `curve.csv` and `curve.png` (return vs env steps); returns their paths.

  The plot leaves out training averages over a partial window after a resume
  (`full_windows`); the CSV keeps every record.
  """
  records = read_progress(logdir)
  csv_path = os.path.join(logdir, 'curve.csv')
  with open_file(csv_path, 'w') as f:
    writer = csv.writer(f)
    writer.writerow(COLUMNS)
    for r in records:
      writer.writerow(['' if r.get(c) is None else r.get(c) for c in COLUMNS])
  png_path = os.path.join(logdir, 'curve.png')
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4))
  full = full_windows(records)
  points = [(r['env_steps'], r['average_return']) for r, ok in zip(records, full)
            if ok and r.get('average_return') is not None]
  if points:
    ax.plot(*zip(*points), label='training (last 100 episodes)')
  # The evaluator's average only where it changed: records repeat the last one while
  # the evaluator idles between rounds (`eval_interval_s`), which drawn as a line
  # looks like a measured plateau.
  points, seen = [], None
  for r in records:
    if r.get('eval_average_return') is not None and r.get('eval_episodes') != seen:
      points.append((r['env_steps'], r['eval_average_return']))
    seen = r.get('eval_episodes')
  if points:
    ax.plot(*zip(*points), 'o', markersize=3, label='greedy evaluator (last 20)')
  ax.set_xlabel('env steps')
  ax.set_ylabel('average return')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  plt.close(fig)
  with open_file(png_path, 'wb') as f:
    f.write(png.getvalue())
  return {'csv': csv_path, 'png': png_path}
