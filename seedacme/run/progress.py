"""Progress of a run: a JSON-lines file, TensorBoard scalars and a log line.

The central node writes one record per interval to `<logdir>/progress.jsonl` (the
launcher tails it to draw the console progress line) and the last one to
`<logdir>/summary.json`. The logdir may be remote (`gs://...` on Vertex AI): files go
through `tf.io.gfile`, and where appending is not possible the file is rewritten.
"""

import json
import math
import os
from typing import Any, Dict

from absl import logging


def _finite(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def _is_local(path: str) -> bool:
  return '://' not in path


def rewrite(path: str, text: str) -> None:
  """Replaces a file's contents through `tf.io.gfile` (local, `gs://`, `ram://`).

  Removes the file first: not every TF file system truncates on 'w' (TF 2.8's
  `ram://` appends), and one that does loses nothing by it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not _is_local(path) and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(text)


class ProgressWriter:
  """Appends progress records; mirrors numeric fields to TensorBoard."""

  def __init__(self, logdir: str):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.io.gfile.makedirs(logdir)
    self._logdir = logdir
    self._path = os.path.join(logdir, 'progress.jsonl')
    self._summary_writer = None
    self._remote_lines = None  # remote files cannot be appended to: keep and rewrite

  def _append(self, line: str) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if _is_local(self._path):
      with open(self._path, 'a') as f:
        f.write(line + '\n')
      return
    if self._remote_lines is None:
      self._remote_lines = []
      if tf.io.gfile.exists(self._path):  # a resumed run continues the same file
        with tf.io.gfile.GFile(self._path) as f:
          self._remote_lines = f.read().splitlines()
    self._remote_lines.append(line)
    rewrite(self._path, '\n'.join(self._remote_lines) + '\n')

  def _tb(self):
    if self._summary_writer is None:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._summary_writer = tf.summary.create_file_writer(
          os.path.join(self._logdir, 'tensorboard'))
    return self._summary_writer

  def write(self, record: Dict[str, Any]) -> None:
    record = {k: _finite(v) for k, v in record.items()}
    self._append(json.dumps(record))
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    step = int(record.get('env_steps', 0))
    with self._tb().as_default():
      for key, value in record.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          tf.summary.scalar(key, value, step=step)
    self._tb().flush()
    logging.info('progress: %s', format_line(record))

  def log_event(self, message: str) -> None:
    """A one-off event in the progress file (shown by the launcher)."""
    self._append(json.dumps({'event': message}))
    logging.info('%s', message)

  def write_summary(self, record: Dict[str, Any]) -> None:
    rewrite(os.path.join(self._logdir, 'summary.json'),
            json.dumps({k: _finite(v) for k, v in record.items()}, indent=1))


def _fmt(value, spec: str) -> str:
  return '-' if value is None or (isinstance(value, float) and math.isnan(value)) \
      else format(value, spec)


def format_line(r: Dict[str, Any]) -> str:
  """One console line: time, env steps and rate, returns, learner, replay, batching."""
  g = r.get
  parts = [
      f"{_fmt(g('elapsed_s'), '6.0f')}s",
      f"env steps {_fmt(g('env_steps'), ',d')} ({_fmt(g('env_steps_per_s'), ',.0f')}/s)",
      f"episodes {_fmt(g('episodes'), 'd')}",
      f"return {_fmt(g('average_return'), '.3f')}",
      f"eval {_fmt(g('eval_average_return'), '.3f')}",
      f"learner steps {_fmt(g('learner_steps'), 'd')} ({_fmt(g('learner_steps_per_s'), '.1f')}/s)",
      f"replay {_fmt(g('replay_size'), 'd')} (+{_fmt(g('replay_inserts'), 'd')}"
      f" -{_fmt(g('replay_samples'), 'd')})",
  ]
  if g('learner_priority_updates') is not None:
    parts.append(f"priority updates {int(g('learner_priority_updates'))}")
  parts.append(f"batch fill {_fmt(g('batch_fill'), '.0%')}")
  parts.append(f"latency {_fmt(g('latency_ms'), '.1f')}ms p99 {_fmt(g('latency_p99_ms'), '.1f')}ms")
  return ' | '.join(parts)
