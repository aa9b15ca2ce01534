"""Reading a run's logdir: progress records, events and the summary, in one place.

The central node writes `progress.jsonl` (one JSON record per line: progress records,
and `{"event": ...}` lines such as a resume) and `summary.json` (`seedacme.run.progress`).
The launcher tails the progress file to draw its console line, the curves read it
whole, and benchmarks and tests read both; they all go through these functions.

The logdir may be remote (`gs://...` on Vertex AI): files then go through
`tf.io.gfile`; local paths use plain `open`, so that a launcher reading a local run
does not import TensorFlow.
"""

import json
import os
from typing import Any, Dict, List, Tuple

PROGRESS = 'progress.jsonl'
SUMMARY = 'summary.json'


def open_file(path: str, mode: str = 'r'):
  """`open` for local paths, `tf.io.gfile.GFile` for remote ones (a new file on 'w')."""
  if '://' not in path:
    return open(path, mode, newline='' if 'b' not in mode else None)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if 'w' in mode and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # not every TF file system truncates (see progress.rewrite)
  return tf.io.gfile.GFile(path, mode)


def exists(path: str) -> bool:
  if '://' not in path:
    return os.path.exists(path)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile.exists(path)


def tail_lines(logdir: str, offset: int = 0) -> Tuple[List[Dict[str, Any]], int]:
  """The complete lines of `progress.jsonl` after byte `offset` (records and events,
  in file order) and the offset after them; a line still being written waits."""
  path = os.path.join(logdir, PROGRESS)
  if not exists(path):
    return [], offset
  with open_file(path) as f:
    f.seek(offset)
    data = f.read()
  end = data.rfind('\n') + 1
  lines = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
  return lines, offset + len(data[:end].encode())


def read_progress(logdir: str) -> List[Dict[str, Any]]:
  """Progress records (events left out), across resumed runs in file order."""
  return [r for r in tail_lines(logdir)[0] if 'event' not in r]


def read_events(logdir: str) -> List[str]:
  """The events of `progress.jsonl` (e.g. 'resumed from checkpoint at ...')."""
  return [r['event'] for r in tail_lines(logdir)[0] if 'event' in r]


def read_summary(logdir: str) -> Dict[str, Any] | None:
  """`summary.json` (None while the run has not written it)."""
  path = os.path.join(logdir, SUMMARY)
  if not exists(path):
    return None
  with open_file(path) as f:
    return json.load(f)
