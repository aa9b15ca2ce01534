"""Learning curves from `<logdir>/progress.jsonl`: a CSV table and a PNG plot."""

import csv
import json
import os
from typing import Dict, List

COLUMNS = ('env_steps', 'elapsed_s', 'learner_steps', 'average_return',
           'eval_average_return', 'env_steps_per_s', 'learner_steps_per_s')


def read_progress(logdir: str) -> List[Dict]:
  """Progress records (events left out), across resumed runs in file order."""
  path = os.path.join(logdir, 'progress.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if 'event' not in r]


def write_curves(logdir: str, title: str = '') -> Dict[str, str]:
  """Writes `curve.csv` and `curve.png` (return vs env steps); returns their paths."""
  records = read_progress(logdir)
  csv_path = os.path.join(logdir, 'curve.csv')
  with open(csv_path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(COLUMNS)
    for r in records:
      writer.writerow(['' if r.get(c) is None else r.get(c) for c in COLUMNS])
  png_path = os.path.join(logdir, 'curve.png')
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4))
  for key, label in (('average_return', 'training (last 100 episodes)'),
                     ('eval_average_return', 'greedy evaluator (last 20)')):
    points = [(r['env_steps'], r[key]) for r in records if r.get(key) is not None]
    if points:
      ax.plot(*zip(*points), label=label)
  ax.set_xlabel('env steps')
  ax.set_ylabel('average return')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(png_path, dpi=100)
  plt.close(fig)
  return {'csv': csv_path, 'png': png_path}
