"""Learning curves from `<logdir>/progress.jsonl`: a CSV table and a PNG plot.

The logdir may be remote (`gs://...` on Vertex AI): files go through `tf.io.gfile`
there, and through plain `open` for local paths, so that a launcher drawing the curves
of a local run does not import TensorFlow.
"""

import csv
import io
import json
import os
from typing import Dict, List


def _open(path: str, mode: str = 'r'):
  if '://' not in path:
    return open(path, mode, newline='' if 'b' not in mode else None)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if 'w' in mode and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # not every TF file system truncates (see progress.rewrite)
  return tf.io.gfile.GFile(path, mode)


def _exists(path: str) -> bool:
  if '://' not in path:
    return os.path.exists(path)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile.exists(path)

COLUMNS = ('env_steps', 'elapsed_s', 'learner_steps', 'average_return',
           'eval_average_return', 'env_steps_per_s', 'learner_steps_per_s')


def read_progress(logdir: str) -> List[Dict]:
  """Progress records (events left out), across resumed runs in file order."""
  path = os.path.join(logdir, 'progress.jsonl')
  if not _exists(path):
    return []
  with _open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if 'event' not in r]


def write_curves(logdir: str, title: str = '') -> Dict[str, str]:
  """Writes `curve.csv` and `curve.png` (return vs env steps); returns their paths."""
  records = read_progress(logdir)
  csv_path = os.path.join(logdir, 'curve.csv')
  with _open(csv_path, 'w') as f:
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
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  plt.close(fig)
  with _open(png_path, 'wb') as f:
    f.write(png.getvalue())
  return {'csv': csv_path, 'png': png_path}
