"""Directories and files in shared places, made or reused only when they are ours.

A run writes into places other users of a cluster can reach first: `$TMPDIR` on a
compute node, a logdir under /tmp, a group-writable project directory or NFS. A path
another uid made before us (a directory, or a symlink planted where a file will be
written) would let that uid swap the code a task runs, read keys, or clobber a file of
ours through the link (issue 62: seen on a Slurm node with uid 65534). So every such
path goes through one of these:

- `owned_dir(path)`: made (mode 0700 by default; `mode` may widen it to read-only for
  others, never to writable) if missing; if it exists, it must be a real directory of
  this uid and not group/other-writable (`own_links`: or a symlink of this uid to one).
  Else `UnsafePathError` naming the path, its owner and mode.
- `private_dir(path)`: the same, and nobody else may read it either (mode 0700): for
  keys and for directories code is run from.
- `private_tempdir(base, prefix)`: a new 0700 directory named `prefix` + 16 random hex
  digits (unguessable, and never a '_', which Launchpad 0.5.0's temp paths must not
  hold), made with `mkdir` (fails on anything already there, a symlink included) under
  a base that is ours, or root's and sticky (/tmp): `base_problem`.
- `write_private(path, data)`: `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600: never
  through a link, never into a file someone made first. `replace_file`: the same into
  a new name beside `path`, then renamed over it (a link at `path` is replaced, not
  followed). `open_nofollow`: a log file opened for writing, refusing a link.

Checked with `lstat` on the path itself: the parent of a directory of ours may still
let a group member rename it away (a group-writable directory without the sticky bit);
what the project assumes of a node's other users is in docs/reliability.md ("Shared
clusters"). Stdlib only: launchers and the Slurm task import this before anything else.
"""

import os
import pwd
import secrets
import stat
import tempfile

_LINK_HOPS = 8  # own symlinks followed at most (`own_links`)


class UnsafePathError(RuntimeError):
  """A shared place holds a path this process must not use; the message says why."""


def _owner(uid: int) -> str:
  try:
    return f'{pwd.getpwuid(uid).pw_name} (uid {uid})'
  except KeyError:
    return f'uid {uid}'


def path_problem(path: str, private: bool = False, own_links: bool = False) -> str | None:
  """Why the existing `path` is not a directory this process may trust, or None.

  `private`: also refuse group/other read and execute (keys, code). `own_links`: a
  symlink this uid owns (every hop) to such a directory is accepted (a logdir the user
  linked to scratch space); any other symlink is refused."""
  try:
    st = os.lstat(path)
  except FileNotFoundError:
    return f'{path} does not exist'
  where = path
  for _ in range(_LINK_HOPS):
    if not stat.S_ISLNK(st.st_mode):
      break
    target = os.readlink(where)
    if not own_links or st.st_uid != os.geteuid():
      return f'{path} is a symlink (to {target!r}), owned by {_owner(st.st_uid)}'
    where = os.path.join(os.path.dirname(where), target)
    try:
      st = os.lstat(where)
    except FileNotFoundError:
      return f'{path} is a symlink to {where}, which does not exist'
  else:
    return f'{path}: more than {_LINK_HOPS} symlinks'
  shown = path if where == path else f'{path} (-> {where})'
  if not stat.S_ISDIR(st.st_mode):
    return f'{shown} is not a directory'
  if st.st_uid != os.geteuid():
    return (f'{shown} belongs to {_owner(st.st_uid)}, not to this user '
            f'({_owner(os.geteuid())})')
  mode = stat.S_IMODE(st.st_mode)
  mask = 0o077 if private else 0o022
  if mode & mask:
    return (f'{shown} has mode {mode:04o}: '
            f'{"others can read or enter it" if private else "others can write into it"}'
            f' (want {"0700" if private else "no group/other write"}; chmod '
            f'{"700" if private else "go-w"} it if that is right)')
  return None


def _fix_mode(path: str, mode: int) -> None:
  """Sets `path`'s mode through a descriptor of the directory itself (never a link
  put in its place), checking it is still the one this uid made."""
  fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, 'O_NOFOLLOW', 0))
  try:
    if os.fstat(fd).st_uid != os.geteuid():
      raise UnsafePathError(f'{path} was replaced by another user\'s directory')
    os.fchmod(fd, mode)
  finally:
    os.close(fd)


def owned_dir(path: str, mode: int = 0o700, private: bool = False,
              purpose: str = 'directory', own_links: bool = False) -> str:
  """`path`, made with `mode` (parents as `os.makedirs` would) if missing, else
  checked (`path_problem`). Raises `UnsafePathError` naming the path and its owner.

  A `mode` with no group/other bits is set exactly; a wider one (0755) is narrowed by
  the umask as `mkdir` does. Group/other write is never asked for."""
  if mode & 0o022:
    raise ValueError(f'owned_dir: mode {mode:04o} lets others write')
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  if parent and not os.path.isdir(parent):
    os.makedirs(parent, exist_ok=True)
  try:
    os.mkdir(path, mode)
  except FileExistsError:
    problem = path_problem(path, private, own_links)
    if problem:
      raise UnsafePathError(f'refusing to use the {purpose}: {problem}') from None
    return path
  if not mode & 0o077:
    _fix_mode(path, mode)  # the umask does not narrow a private dir below 0700
  return path


def private_dir(path: str, purpose: str = 'directory') -> str:
  """`owned_dir` with mode 0700 required."""
  return owned_dir(path, 0o700, private=True, purpose=purpose)


def base_problem(base: str) -> str | None:
  """Why `base` cannot hold our temp dirs, or None: it must be ours (not
  group/other-writable), or root's with the sticky bit (as /tmp), so no one else can
  remove or rename what we make there."""
  try:
    st = os.stat(base)  # a symlinked /tmp (macOS) is fine: the target is checked
  except OSError as e:
    return f'{base}: {e.strerror}'
  if not stat.S_ISDIR(st.st_mode):
    return f'{base} is not a directory'
  mode = stat.S_IMODE(st.st_mode)
  if st.st_uid == os.geteuid() and not mode & 0o022:
    return None
  if st.st_uid in (0, os.geteuid()) and mode & stat.S_ISVTX:
    return None
  return (f'{base} (owner {_owner(st.st_uid)}, mode {mode:04o}) lets others write into '
          'it without the sticky bit')


def private_tempdir(base: str | None = None, prefix: str = 'seedacme-') -> str:
  """A new 0700 directory `<base>/<prefix><16 hex digits>` (default base: the temp
  dir); `UnsafePathError` when `base` lets others replace what is made there."""
  base = base or tempfile.gettempdir()
  problem = base_problem(base)
  if problem:
    raise UnsafePathError(f'refusing to make a temp dir under {problem}')
  for _ in range(100):
    path = os.path.join(os.path.abspath(base), f'{prefix}{secrets.token_hex(8)}')
    try:
      os.mkdir(path, 0o700)
    except FileExistsError:
      continue  # 64 random bits: only a name someone planted on purpose, or chance
    _fix_mode(path, 0o700)
    return path
  raise UnsafePathError(f'could not make a new directory {prefix}... under {base}')


def write_private(path: str, data: bytes | str, mode: int = 0o600) -> None:
  """Creates `path` (must not exist; never follows a link) and writes `data`."""
  flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0)
  try:
    fd = os.open(path, flags, mode)
  except FileExistsError:
    st = os.lstat(path)
    raise UnsafePathError(f'refusing to write {path}: it exists already (owned by '
                          f'{_owner(st.st_uid)}{", a symlink" if stat.S_ISLNK(st.st_mode) else ""})'
                          ) from None
  with os.fdopen(fd, 'wb' if isinstance(data, bytes) else 'w') as f:
    f.write(data)


def replace_file(path: str, data: bytes | str, mode: int = 0o644) -> None:
  """`path` replaced by a new file holding `data`: written (`write_private`) to a new
  name beside it, then renamed over it, so a symlink at `path` is replaced rather than
  followed and a reader sees the old file or the new one."""
  directory, name = os.path.split(os.path.abspath(path))
  tmp = os.path.join(directory, f'.{name}.{secrets.token_hex(6)}')
  write_private(tmp, data, mode)
  try:
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def open_nofollow(path: str, append: bool = False, mode: int = 0o644):
  """`open(path, 'a' or 'w')` that refuses a symlink at `path` (OSError ELOOP)."""
  flags = os.O_WRONLY | os.O_CREAT | getattr(os, 'O_NOFOLLOW', 0) | \
      (os.O_APPEND if append else os.O_TRUNC)
  return os.fdopen(os.open(path, flags, mode), 'a' if append else 'w')
