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

  def log_event(self, message: str) -> None:
    """A one-off event in the progress file (shown by the launcher)."""
    with open(self._path, 'a') as f:
      f.write(json.dumps({'event': message}) + '\n')
    logging.info('%s', message)

  def write_summary(self, record: Dict[str, Any]) -> None:
    with open(os.path.join(self._logdir, 'summary.json'), 'w') as f:
      json.dump({k: _finite(v) for k, v in record.items()}, f, indent=1)


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
