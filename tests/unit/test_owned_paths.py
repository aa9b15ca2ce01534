"""`owned_paths` against another user of the machine (issue 62, item 1).

The attacks run as uid 65534 (`setpriv`), as another user of a shared node would, in a
directory shaped like /tmp (root's, mode 1777) or like a shared project directory
without the sticky bit: a directory planted where ours will be, a symlink planted where
a file of ours will be written, a directory of ours others can write into, and a base
where others can rename what we make. Each is refused by name (path, owner), and the
file the link points at is left as it was. Needs root (to switch uid).
"""

import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from seedacme.runtime import owned_paths
from seedacme.runtime.owned_paths import UnsafePathError

OTHER = 65534


def as_other(script: str) -> subprocess.CompletedProcess:
  """`sh -c script` as uid/gid 65534 with no groups."""
  return subprocess.run(['setpriv', f'--reuid={OTHER}', f'--regid={OTHER}',
                         '--clear-groups', 'sh', '-c', script], capture_output=True,
                        text=True, timeout=30, check=False)


@pytest.fixture
def shared():
  """A directory like /tmp: root's, world-writable, sticky; removed after. Without
  '_' (Launchpad 0.5.0's temp dirs cannot hold one, and the launchers say so first)."""
  path = tempfile.mkdtemp(prefix='seedacmeshared', dir='/tmp')
  while '_' in path:
    os.rmdir(path)
    path = tempfile.mkdtemp(prefix='seedacmeshared', dir='/tmp')
  os.chmod(path, 0o1777)
  yield path
  shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(shared):
  """A file of ours an attacker would like to clobber."""
  path = os.path.join(shared, 'victim')
  with open(path, 'w') as f:
    f.write('precious')
  return path


@pytest.mark.needs_other_uid
def test_a_directory_planted_by_another_uid_is_refused_naming_its_owner(shared, victim):
  planted = os.path.join(shared, 'run')
  done = as_other(f'mkdir -m 777 {planted} && ln -s {victim} {planted}/pid')
  assert done.returncode == 0, done.stderr
  for make in (owned_paths.owned_dir, owned_paths.private_dir):
    with pytest.raises(UnsafePathError, match=f'{planted} belongs to nobody \\(uid {OTHER}\\)'):
      make(planted)
  # The file that would be written there is refused too, and the link not followed.
  with pytest.raises(UnsafePathError, match=f'owned by nobody \\(uid {OTHER}\\), a symlink'):
    owned_paths.write_private(os.path.join(planted, 'pid'), '123')
  with open(victim) as f:
    assert f.read() == 'precious'


@pytest.mark.needs_other_uid
def test_a_symlink_planted_where_a_dir_or_file_goes_is_never_followed(shared, victim):
  mine = owned_paths.owned_dir(os.path.join(shared, 'mine'))
  link_dir, link_file = os.path.join(shared, 'logdir'), os.path.join(shared, 'batch.sh')
  done = as_other(f'ln -s {mine} {link_dir} && ln -s {victim} {link_file}')
  assert done.returncode == 0, done.stderr
  # A link of another uid's is refused even when it points at a directory of ours
  # (it can be pointed elsewhere later), with own_links too.
  for own_links in (False, True):
    with pytest.raises(UnsafePathError, match=f'{link_dir} is a symlink .* owned by nobody'):
      owned_paths.owned_dir(link_dir, own_links=own_links)
  with pytest.raises(UnsafePathError, match='a symlink'):
    owned_paths.write_private(link_file, 'x')
  with pytest.raises(OSError):  # ELOOP
    owned_paths.open_nofollow(link_file)
  owned_paths.replace_file(link_file, 'new')  # replaces the link itself
  assert not os.path.islink(link_file) and os.stat(link_file).st_uid == 0
  with open(victim) as f:
    assert f.read() == 'precious'
  # A link of our own to a directory of ours is fine where own_links allows it.
  ours = os.path.join(shared, 'ours')
  os.symlink(mine, ours)
  assert owned_paths.owned_dir(ours, own_links=True) == ours
  with pytest.raises(UnsafePathError, match='is a symlink'):
    owned_paths.owned_dir(ours)


@pytest.mark.needs_other_uid
def test_a_directory_of_ours_others_can_write_into_is_refused(shared):
  path = os.path.join(shared, 'open')
  os.mkdir(path)
  os.chmod(path, 0o777)
  done = as_other(f'touch {path}/planted')  # why it matters: anyone can add files
  assert done.returncode == 0, done.stderr
  with pytest.raises(UnsafePathError, match='mode 0777: others can write into it'):
    owned_paths.owned_dir(path, 0o755)
  os.chmod(path, 0o775)
  with pytest.raises(UnsafePathError, match='mode 0775'):
    owned_paths.owned_dir(path, 0o755)
  os.chmod(path, 0o755)
  assert owned_paths.owned_dir(path, 0o755) == path
  with pytest.raises(UnsafePathError, match='others can read or enter it'):
    owned_paths.private_dir(path)  # keys and code: 0700 only
  with pytest.raises(ValueError):
    owned_paths.owned_dir(os.path.join(shared, 'x'), 0o775)  # never made writable


@pytest.mark.needs_other_uid
def test_a_base_without_the_sticky_bit_is_refused_and_a_sticky_one_holds(shared):
  open_base = os.path.join(shared, 'project')
  os.mkdir(open_base)
  os.chmod(open_base, 0o777)
  # Why: there anyone can rename our directory away and put theirs in its place.
  ours = tempfile.mkdtemp(dir=open_base)
  done = as_other(f'mv {ours} {ours}.gone && mkdir -m 777 {ours}')
  assert done.returncode == 0, done.stderr
  assert os.stat(ours).st_uid == OTHER
  assert 'without the sticky bit' in owned_paths.base_problem(open_base)
  with pytest.raises(UnsafePathError, match=f'{open_base} .*mode 0777.* without the sticky'):
    owned_paths.private_tempdir(open_base)
  # Root's sticky /tmp-like base: the same moves fail, and nothing gets in.
  made = owned_paths.private_tempdir(shared, prefix='seedacme-slurm-1-0-0-')
  assert os.path.dirname(made) == shared and '_' not in os.path.basename(made)
  assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
  done = as_other(f'mv {made} {made}.gone 2>/dev/null && echo MOVED; '
                  f'touch {made}/x 2>/dev/null && echo WROTE; '
                  f'ls {made} >/dev/null 2>&1 && echo LISTED; echo TRIED')
  assert done.stdout.split() == ['TRIED'], done.stdout
  assert os.listdir(made) == []


def test_modes_hold_whatever_the_umask():
  base = tempfile.mkdtemp()
  old = os.umask(0)
  try:
    assert stat.S_IMODE(os.stat(owned_paths.private_dir(f'{base}/a')).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(owned_paths.owned_dir(f'{base}/b', 0o755)).st_mode) == 0o755
    os.umask(0o077)
    assert stat.S_IMODE(os.stat(owned_paths.owned_dir(f'{base}/c', 0o755)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(owned_paths.private_tempdir(base)).st_mode) == 0o700
  finally:
    os.umask(old)
    shutil.rmtree(base)
  names = {os.path.basename(owned_paths.private_tempdir(prefix='seedacmex')) for _ in range(50)}
  for name in names:
    os.rmdir(os.path.join(tempfile.gettempdir(), name))
  assert len(names) == 50 and not any('_' in n for n in names)


# ---- A run's logdir and a launcher's temp and log dirs (Deliver 1) ------------------

@pytest.mark.needs_other_uid
def test_a_logdir_another_uid_made_is_refused_by_each_launcher_in_one_line(shared, capsys):
  """Another user creates the logdir path first (a logdir under /tmp): the local and
  cluster launchers refuse it naming the path and its owner, before writing anything;
  the central node's own `makedirs` refuses it too. A logdir of ours is fine, made
  0755 when missing; one others can write into is refused."""
  from seedacme.launchers import cluster, local  # pylint: disable=g-import-not-at-top
  from seedacme.run import logdir as logdir_lib  # pylint: disable=g-import-not-at-top
  planted = os.path.join(shared, 'run')
  assert as_other(f'mkdir -m 777 {planted}').returncode == 0
  named = f'refusing to use the logdir: {planted} belongs to nobody (uid {OTHER})'
  with pytest.raises(UnsafePathError, match='belongs to nobody'):
    logdir_lib.LocalFileSystem().makedirs(planted)  # the central node's ProgressWriter
  assert local.main(['catch', 'vtrace', '1', '--logdir', planted, '--network', 'host']) == 2
  assert named in capsys.readouterr().err
  assert cluster.main(['catch', 'vtrace', '1', '--dry_run', '--network', 'host',
                       '--logdir', planted]) == 2
  assert named in capsys.readouterr().err
  assert os.listdir(planted) == []
  fresh = os.path.join(shared, 'fresh')
  assert logdir_lib.local_logdir_problem(fresh) is None  # will be made ours
  logdir_lib.LocalFileSystem().makedirs(os.path.join(fresh, 'nodes'))
  assert stat.S_IMODE(os.stat(fresh).st_mode) & 0o022 == 0
  assert logdir_lib.local_logdir_problem(fresh) is None
  os.chmod(fresh, 0o777)
  assert 'others can write into it' in logdir_lib.local_logdir_problem(fresh)
  assert logdir_lib.local_logdir_problem('gs://bucket/run') is None


@pytest.mark.needs_other_uid
def test_staged_code_executables_and_replica_logs_refuse_shared_places(shared, victim,
                                                                       monkeypatch):
  """The cluster and Vertex launchers' temp dir (staged code, Launchpad's executables)
  must be one no one else can replace them in; replica logs go to a dir of ours and
  never through a link."""
  from seedacme.launchers import emulation, vertex  # pylint: disable=g-import-not-at-top
  open_base = os.path.join(shared, 'project')
  os.mkdir(open_base)
  os.chmod(open_base, 0o777)
  monkeypatch.setattr(tempfile, 'tempdir', open_base)
  assert 'other users could replace the code' in vertex.temp_dir_error()
  with pytest.raises(UnsafePathError, match='without the sticky bit'):
    vertex.stage_code_directory()
  with pytest.raises(UnsafePathError, match='refusing to build executables'):
    emulation.build_pools(None, {}, {})
  assert os.listdir(open_base) == []
  monkeypatch.setattr(tempfile, 'tempdir', shared)  # root's and sticky: fine
  assert vertex.temp_dir_error() is None
  logs = os.path.join(shared, 'replicas')
  assert as_other(f'mkdir -m 777 {logs} && ln -s {victim} {logs}/actor-0').returncode == 0
  replicas = emulation.Replicas()
  with pytest.raises(UnsafePathError, match=f'replica log dir: {logs} belongs to nobody'):
    replicas.start('actor', shared, ['true'], 0, {}, None, logs)
  assert not replicas.procs
  with open(victim) as f:
    assert f.read() == 'precious'
