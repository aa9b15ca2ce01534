"""Temp dirs that a killed run does not leave behind: held by a lock, swept once dead.

A supervisor gives each child its own `TMPDIR` and a replay node gives Reverb a
checkpoint dir in `$TMPDIR`; both are removed when their process ends -- unless the
whole program is SIGKILLed (an OOM killer, `scancel --signal=KILL`, a test's kill),
when nothing runs to remove them. Seen here: `seedacme_child_*` dirs with autograph's
files and `seedacme_reverb_*` dirs, each holding a Reverb checkpoint (an R2D2 table's
is hundreds of MB), piling up in /tmp across test suites.

So such a dir is made with `held_tempdir`: a `.held` file in it is `flock`ed for as
long as its owner lives, and `pass_fds` hands the same lock to a child, so the lock
lasts while any of them lives (a lock belongs to the open file, not the pid: no pid
reuse, and it holds across pid namespaces sharing a /tmp). `sweep_dead(prefix)`, run
when the next supervisor or replay node starts, removes this uid's dirs of that prefix
whose lock it can take: their every holder is gone. A dir younger than a minute, or
without a `.held` (made by an older version, or by another user), is left alone.
"""

import fcntl
import os
import shutil
import stat
import tempfile
import time

HELD = '.held'
MIN_AGE_S = 60.0  # younger dirs may be between mkdtemp and their flock


class HeldDir:
  """A temp dir and the open, locked `.held` file that says its owner lives."""

  def __init__(self, path: str, fd: int):
    self.path, self.fd = path, fd

  def release(self) -> None:
    """Removes the dir and drops the lock (idempotent)."""
    shutil.rmtree(self.path, ignore_errors=True)
    if self.fd >= 0:
      os.close(self.fd)
      self.fd = -1


def held_tempdir(prefix: str, base: str | None = None) -> HeldDir:
  """A new dir under `base` (default `tempfile.gettempdir()`), locked by this process."""
  path = tempfile.mkdtemp(prefix=prefix, dir=base)
  try:
    fd = os.open(os.path.join(path, HELD),
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BaseException:
    shutil.rmtree(path, ignore_errors=True)
    raise
  return HeldDir(path, fd)


def _dead(path: str, now: float) -> bool:
  """Whether `path` is this uid's held dir, old enough, whose lock nobody holds."""
  try:
    st = os.lstat(path)
  except OSError:
    return False
  if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
      or now - st.st_mtime < MIN_AGE_S):
    return False
  try:
    fd = os.open(os.path.join(path, HELD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    return False  # held: its owner lives
  finally:
    os.close(fd)  # drops the lock too
  return True


def sweep_dead(prefix: str, base: str | None = None) -> list:
  """Removes this uid's `prefix*` dirs under `base` left by processes that are gone.

  Returns the paths removed. Never raises: a sweep that cannot read `base` sweeps
  nothing."""
  base = base or tempfile.gettempdir()
  try:
    names = [n for n in os.listdir(base) if n.startswith(prefix)]
  except OSError:
    return []
  now, removed = time.time(), []
  for name in names:
    path = os.path.join(base, name)
    if _dead(path, now):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed
