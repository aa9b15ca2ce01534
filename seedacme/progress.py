"""Progress of a run: a JSON-lines file, TensorBoard scalars and a log line.

The central node writes one record per interval to `<logdir>/progress.jsonl` (the
launcher tails it to draw the console progress line) and the last one to
`<logdir>/summary.json`.
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


class ProgressWriter:
  """Appends progress records; mirrors numeric fields to TensorBoard."""

  def __init__(self, logdir: str):
    os.makedirs(logdir, exist_ok=True)
    self._logdir = logdir
    self._path = os.path.join(logdir, 'progress.jsonl')
    self._summary_writer = None

  def _tb(self):
    if self._summary_writer is None:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._summary_writer = tf.summary.create_file_writer(
          os.path.join(self._logdir, 'tensorboard'))
    return self._summary_writer

  def write(self, record: Dict[str, Any]) -> None:
    record = {k: _finite(v) for k, v in record.items()}
    with open(self._path, 'a') as f:
      f.write(json.dumps(record) + '\n')
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    step = int(record.get('env_steps', 0))
    with self._tb().as_default():
      for key, value in record.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          tf.summary.scalar(key, value, step=step)
    self._tb().flush()
    logging.info('progress: %s', format_line(record))

  def write_summary(self, record: Dict[str, Any]) -> None:
    with open(os.path.join(self._logdir, 'summary.json'), 'w') as f:
      json.dump({k: _finite(v) for k, v in record.items()}, f, indent=1)


def _fmt(value, spec: str) -> str:
  return '-' if value is None or (isinstance(value, float) and math.isnan(value)) \
      else format(value, spec)


def format_line(r: Dict[str, Any]) -> str:
  """One console line: time, env steps and rate, returns, learner, queue, batching."""
  return (f"{_fmt(r.get('elapsed_s'), '6.0f')}s | env steps {_fmt(r.get('env_steps'), ',d')}"
          f" ({_fmt(r.get('env_steps_per_s'), ',.0f')}/s) | episodes "
          f"{_fmt(r.get('episodes'), 'd')} | return {_fmt(r.get('average_return'), '.3f')}"
          f" | eval {_fmt(r.get('eval_average_return'), '.3f')} | learner steps "
          f"{_fmt(r.get('learner_steps'), 'd')} ({_fmt(r.get('learner_steps_per_s'), '.1f')}/s)"
          f" | queue {_fmt(r.get('replay_size'), 'd')} | batch fill "
          f"{_fmt(r.get('batch_fill'), '.0%')} | latency {_fmt(r.get('latency_ms'), '.1f')}ms"
          f" p99 {_fmt(r.get('latency_p99_ms'), '.1f')}ms")
