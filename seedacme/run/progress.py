"""Progress of a run: a JSON-lines log, TensorBoard scalars and a log line.

The central node writes one record per interval to the progress log (the launcher
tails it to draw the console progress line) and the last one to `<logdir>/summary.json`.
How they are written so that a kill tears nothing -- appended lines locally, segments
on a remote logdir (`gs://...` on Vertex AI), JSON files by rename -- is
`seedacme.run.logdir`'s.
"""

import json
import math
import os
from typing import Any, Dict, List

from absl import logging

from seedacme.run import logdir as logdir_lib


def _finite(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


class ProgressWriter:
  """Appends progress records; mirrors numeric fields to TensorBoard (`tensorboard`)."""

  def __init__(self, logdir: str, tensorboard: bool = True):
    self._fs = logdir_lib.filesystem(logdir)
    self._fs.makedirs(logdir)
    self._logdir = logdir
    self._path = os.path.join(logdir, logdir_lib.PROGRESS)
    self._summary_writer = None
    self._tensorboard = tensorboard
    # Remote: the segment this writer fills (number, lines); None until the first line.
    self._segment: tuple[int, List[str]] | None = None

  def _append(self, line: str) -> None:
    if logdir_lib.is_local(self._logdir):
      with open(self._path, 'a') as f:
        f.write(line + '\n')
      return
    # A remote file cannot be appended to: this line goes into this writer's current
    # segment, rewritten whole by rename; full segments and other writers' stay as
    # they are (a restarted node starts a segment after the last one).
    if self._segment is None or len(self._segment[1]) >= logdir_lib.SEGMENT_RECORDS:
      if self._segment is None:
        existing = logdir_lib.progress_segments(self._logdir)
        number = existing[-1][0] + 1 if existing else 0
        self._fs.makedirs(os.path.join(self._logdir, logdir_lib.PROGRESS_PARTS))
      else:
        number = self._segment[0] + 1
      self._segment = (number, [])
    number, lines = self._segment
    lines.append(line + '\n')
    try:
      logdir_lib.write_atomic(logdir_lib.segment_path(self._logdir, number), ''.join(lines))
    except BaseException:
      lines.pop()  # not written: the next write must not carry it either
      raise

  def _tb(self):
    if self._summary_writer is None:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._summary_writer = tf.summary.create_file_writer(
          os.path.join(self._logdir, 'tensorboard'))
    return self._summary_writer

  def write(self, record: Dict[str, Any]) -> None:
    record = {k: _finite(v) for k, v in record.items()}
    self._append(json.dumps(record))
    logging.info('progress: %s', format_line(record))
    if not self._tensorboard:
      return
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    step = int(record.get('env_steps', 0))
    with self._tb().as_default():
      for key, value in record.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          tf.summary.scalar(key, value, step=step)
    self._tb().flush()

  def log_event(self, message: str) -> None:
    """A one-off event in the progress file (shown by the launcher)."""
    self._append(json.dumps({'event': message}))
    logging.info('%s', message)

  def write_summary(self, record: Dict[str, Any]) -> None:
    logdir_lib.write_json(os.path.join(self._logdir, logdir_lib.SUMMARY),
                          {k: _finite(v) for k, v in record.items()})


def _fmt(value, spec: str) -> str:
  return '-' if value is None or (isinstance(value, float) and math.isnan(value)) \
      else format(value, spec)


def actors_part(r: Dict[str, Any]) -> str:
  """'actors 2/3 acting': actors the central node heard from within the interval.

  Before this process's learner has taken its first step (`learner_stepped` False:
  start-up, the learner still compiling or waiting for its first batch) actors that
  are not acting yet are expected, so the line says it is start-up rather than leave a
  bare 'actors 0/2' that reads as a fault.
  """
  acting, total = r.get('actors_serving'), r.get('actors')
  text = f"actors {_fmt(acting, 'd')}/{total} acting"
  if r.get('learner_stepped') is False and (acting or 0) < total:
    text += " (start-up, before the learner's first step)"
  return text


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
  if g('actors') is not None:
    parts.append(actors_part(r))
  parts.append(f"batch fill {_fmt(g('batch_fill'), '.0%')}")
  parts.append(f"latency {_fmt(g('latency_ms'), '.1f')}ms p99 {_fmt(g('latency_p99_ms'), '.1f')}ms")
  return ' | '.join(parts)
