"""Learning curves from `<logdir>/progress.jsonl`: a CSV table and a PNG plot.

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
