"""A run's logdir: where its files are, how they are written so a kill cannot tear them,
and how they are read back.

The central node writes progress (`{"event": ...}` lines such as a resume among the
records), `summary.json`, the run's clock and its saved config; the launcher writes
`memory.json`. The launcher tails progress to draw its console line, the curves read
it whole, and benchmarks and tests read both; they all go through these functions.

Writes a kill cannot tear:
- Every JSON file is written whole to a temporary file in the same directory and then
  renamed over the old one (`write_atomic`): a reader sees the old or the new file,
  never a part.
- Progress on a local disk is appended to `progress.jsonl`, one line per record (a
  torn last line is left out by readers until it is complete).
- Progress on a remote file system (`gs://...` on Vertex AI), which cannot append and
  writes an object whole, goes to numbered segments `progress.parts/<n>.jsonl` of at
  most `SEGMENT_RECORDS` lines: a record rewrites only its own (last) segment, by
  rename, so history is never rewritten and the upload per record stays bounded.
  Readers concatenate the segments in order (after a `progress.jsonl` of older runs).

A local logdir, and every directory made in it, is this user's own and not
group/other-writable: made so (`owned_paths.owned_dir`, 0755 under the umask), or, if it
exists, checked to be so (a symlink of the user's to such a directory is fine);
otherwise `UnsafePathError` names the path and its owner. A logdir another user could
create first (under /tmp, a group-writable project directory) would let that user read
the run's files, replace them, or plant links where the run writes (issue 62).
Launchers ask `local_logdir_problem` before starting, to refuse in one line.

Local paths use plain `open`/`os`, so that a launcher reading a local run does not
import TensorFlow; remote ones go through `tf.io.gfile`. `register_filesystem` puts
another implementation behind a path prefix (tests: a file system that behaves like
GCS).
"""

import json
import os
import re
import uuid
from typing import Any, Dict, List, Protocol, Tuple

from seedacme.runtime import owned_paths

PROGRESS = 'progress.jsonl'
PROGRESS_PARTS = 'progress.parts'  # remote progress: numbered segments
SUMMARY = 'summary.json'
SEGMENT_RECORDS = 64  # lines per remote progress segment
_SEGMENT = re.compile(r'^(\d+)\.jsonl$')


class FileSystem(Protocol):
  """What the logdir needs of a file system (`write` writes a whole new file)."""

  def exists(self, path: str) -> bool: ...

  def listdir(self, path: str) -> List[str]: ...

  def makedirs(self, path: str) -> None: ...

  def read(self, path: str) -> bytes: ...

  def size(self, path: str) -> int: ...

  def write(self, path: str, data: bytes) -> None: ...

  def rename(self, src: str, dst: str) -> None: ...  # replaces dst

  def remove(self, path: str) -> None: ...


class LocalFileSystem:
  """Plain files; `rename` is `os.replace` (atomic on POSIX)."""

  def exists(self, path):
    return os.path.exists(path)

  def listdir(self, path):
    return os.listdir(path) if os.path.isdir(path) else []

  def makedirs(self, path):
    owned_paths.owned_dir(path, 0o755, own_links=True)

  def read(self, path):
    with open(path, 'rb') as f:
      return f.read()

  def size(self, path):
    return os.path.getsize(path)

  def write(self, path, data):
    with open(path, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())  # the rename must not publish a file still in the page cache

  def rename(self, src, dst):
    os.replace(src, dst)

  def remove(self, path):
    os.remove(path)


class TfFileSystem:
  """TensorFlow's file systems (`gs://`, ...); `rename` overwrites."""

  def __init__(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._gfile = tf.io.gfile

  def exists(self, path):
    return self._gfile.exists(path)

  def listdir(self, path):
    return self._gfile.listdir(path) if self._gfile.isdir(path) else []

  def makedirs(self, path):
    self._gfile.makedirs(path)

  def read(self, path):
    with self._gfile.GFile(path, 'rb') as f:
      return f.read()

  def size(self, path):
    return self._gfile.stat(path).length

  def write(self, path, data):
    if self._gfile.exists(path):  # not every TF file system truncates on 'w' (ram://)
      self._gfile.remove(path)
    with self._gfile.GFile(path, 'wb') as f:
      f.write(data)

  def rename(self, src, dst):
    self._gfile.rename(src, dst, overwrite=True)

  def remove(self, path):
    self._gfile.remove(path)


_REGISTERED: Dict[str, FileSystem] = {}


def register_filesystem(prefix: str, fs: FileSystem | None) -> None:
  """Serves paths that start with `prefix` from `fs` (None: removes it)."""
  if fs is None:
    _REGISTERED.pop(prefix, None)
  else:
    _REGISTERED[prefix] = fs


def is_local(path: str) -> bool:
  return '://' not in path


def filesystem(path: str) -> FileSystem:
  for prefix, fs in _REGISTERED.items():
    if path.startswith(prefix):
      return fs
  return LocalFileSystem() if is_local(path) else TfFileSystem()


def local_logdir_problem(path: str) -> str | None:
  """Why the local `path` cannot be a run's logdir, or None: None too for a remote
  path and for one that does not exist yet (it will be made this user's)."""
  if not is_local(path) or not os.path.lexists(path):
    return None
  problem = owned_paths.path_problem(path, own_links=True)
  return f'refusing to use the logdir: {problem}' if problem else None


def write_atomic(path: str, text: str) -> None:
  """Replaces `path` with `text`: written whole to a temporary file beside it, then
  renamed over it, so a kill leaves the old file or the new one."""
  fs = filesystem(path)
  directory, name = os.path.split(path)
  tmp = os.path.join(directory, f'.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')
  fs.write(tmp, text.encode())
  try:
    fs.rename(tmp, path)
  except BaseException:
    try:
      fs.remove(tmp)
    except Exception:  # pylint: disable=broad-except
      pass
    raise


def write_json(path: str, value: Any, indent: int | None = 1) -> None:
  """`value` as JSON at `path`, atomically (`write_atomic`)."""
  write_atomic(path, json.dumps(value, indent=indent))


def read_json(path: str) -> Any | None:
  """The JSON at `path` (None: no such file)."""
  fs = filesystem(path)
  if not fs.exists(path):
    return None
  return json.loads(fs.read(path).decode())


def open_file(path: str, mode: str = 'r'):
  """`open` for local paths, `tf.io.gfile.GFile` for remote ones (a new file on 'w')."""
  if is_local(path):
    return open(path, mode, newline='' if 'b' not in mode else None)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if 'w' in mode and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # not every TF file system truncates (ram://)
  return tf.io.gfile.GFile(path, mode)


def exists(path: str) -> bool:
  return filesystem(path).exists(path)


def progress_segments(logdir: str) -> List[Tuple[int, str]]:
  """(number, path) of the remote progress segments, in order."""
  parts = os.path.join(logdir, PROGRESS_PARTS)
  found = []
  for name in filesystem(parts).listdir(parts):
    match = _SEGMENT.match(name.rstrip('/'))
    if match:
      found.append((int(match.group(1)), os.path.join(parts, match.group(0))))
  return sorted(found)


def segment_path(logdir: str, number: int) -> str:
  return os.path.join(logdir, PROGRESS_PARTS, f'{number:08d}.jsonl')


def _progress_files(logdir: str) -> List[str]:
  """The files whose concatenation is the progress log, in order."""
  files = [os.path.join(logdir, PROGRESS)]
  if not is_local(logdir):  # older remote runs wrote one file; segments follow it
    files += [path for _, path in progress_segments(logdir)]
  fs = filesystem(logdir)
  return [f for f in files if fs.exists(f)]


def tail_lines(logdir: str, offset: int = 0) -> Tuple[List[Dict[str, Any]], int]:
  """The complete lines of the progress log after byte `offset` (records and events,
  in order) and the offset after them; a line still being written waits.

  Offsets count bytes over the whole log (on a remote logdir: its segments in order,
  which only ever grow at the end)."""
  fs = filesystem(logdir)
  files = _progress_files(logdir)
  if not files:
    return [], offset
  if len(files) == 1 and is_local(logdir):
    with open(files[0], 'rb') as f:
      f.seek(offset)
      data = f.read()
  else:
    start, chunks = 0, []
    for i, path in enumerate(files):
      last = i == len(files) - 1
      size = None if last else fs.size(path)  # earlier segments are final
      if size is not None and start + size <= offset:
        start += size
        continue
      chunk = fs.read(path)
      chunks.append(chunk[max(0, offset - start):])
      start += len(chunk)
    data = b''.join(chunks)
  end = data.rfind(b'\n') + 1
  lines = [json.loads(line) for line in data[:end].decode().splitlines() if line.strip()]
  return lines, offset + end


def read_progress(logdir: str) -> List[Dict[str, Any]]:
  """Progress records (events left out), across resumed runs in file order."""
  return [r for r in tail_lines(logdir)[0] if 'event' not in r]


def read_events(logdir: str) -> List[str]:
  """The events of the progress log (e.g. 'resumed from checkpoint at ...')."""
  return [r['event'] for r in tail_lines(logdir)[0] if 'event' in r]


def read_summary(logdir: str) -> Dict[str, Any] | None:
  """`summary.json` (None while the run has not written it)."""
  return read_json(os.path.join(logdir, SUMMARY))
