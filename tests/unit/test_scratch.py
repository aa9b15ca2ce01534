"""Temp dirs a SIGKILLed program leaves are swept by the next one, and no others.

Each holder is a real process killed with SIGKILL (nothing of it runs to clean up);
a dir is swept only when every process holding its lock is gone, it is old enough,
and it is this uid's own real directory with a `.held` in it.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from seedacme.runtime import scratch

PREFIX = 'seedacme_test_'
_HOLDER = """
import subprocess, sys, time
from seedacme.runtime import scratch
d = scratch.held_tempdir(sys.argv[1], sys.argv[2])
child = subprocess.Popen(['sleep', '120'], pass_fds=(d.fd,)) if sys.argv[3] == '1' else None
print(d.path, child.pid if child else 0, flush=True)
time.sleep(120)
"""


def _holder(base, with_child=False):
  """A process holding a new dir under `base` (and a child sharing its lock)."""
  proc = subprocess.Popen([sys.executable, '-c', _HOLDER, PREFIX, str(base),
                           '1' if with_child else '0'], stdout=subprocess.PIPE, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  path, child = proc.stdout.readline().split()
  return proc, path, int(child)


def _age(path, seconds=2 * scratch.MIN_AGE_S):
  then = time.time() - seconds
  os.utime(path, (then, then))


def _kill(pid):
  os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_dir_is_swept_once_its_holder_and_the_child_it_shared_the_lock_with_are_gone(
    tmp_path):
  alone, alone_dir, _ = _holder(tmp_path)
  parent, shared_dir, child = _holder(tmp_path, with_child=True)
  try:
    for path in (alone_dir, shared_dir):
      assert os.path.isfile(os.path.join(path, scratch.HELD))
      _age(path)
    assert scratch.sweep_dead(PREFIX, str(tmp_path)) == []  # both held
    alone.kill()
    alone.wait()
    parent.kill()  # SIGKILL: its child lives on and holds the lock
    parent.wait()
    for path in (alone_dir, shared_dir):
      _age(path)
    assert scratch.sweep_dead(PREFIX, str(tmp_path)) == [alone_dir]
    assert os.path.isdir(shared_dir) and not os.path.exists(alone_dir)
    _kill(child)
    deadline = time.time() + 10
    while os.path.exists(f'/proc/{child}') and time.time() < deadline:
      time.sleep(0.05)  # a zombie of the dead parent's, reaped by init
    assert scratch.sweep_dead(PREFIX, str(tmp_path)) == [shared_dir]
    assert os.listdir(tmp_path) == []
  finally:
    for proc in (alone, parent):
      proc.kill()
      proc.wait()
    if os.path.exists(f'/proc/{child}'):
      _kill(child)


@pytest.mark.timeout(60)
def test_young_foreign_unheld_linked_and_other_prefixes_are_left_alone(tmp_path):
  proc, dead, _ = _holder(tmp_path)
  proc.kill()
  proc.wait()
  assert scratch.sweep_dead(PREFIX, str(tmp_path)) == []  # younger than MIN_AGE_S
  # Not ours to remove: no `.held` (an older version's, or made by hand), a file, a
  # link to a dead held dir, another prefix, another uid's dead held dir.
  (tmp_path / f'{PREFIX}unheld').mkdir()
  (tmp_path / f'{PREFIX}file').write_text('x')
  os.symlink(dead, tmp_path / f'{PREFIX}link')
  other = tmp_path / 'other_prefix'
  other.mkdir()
  (other / scratch.HELD).write_text('')
  for name in os.listdir(tmp_path):
    _age(tmp_path / name)
  foreign = None
  if os.getuid() == 0:  # root can make a dir of another uid's
    p2, foreign, _ = _holder(tmp_path)
    p2.kill()
    p2.wait()
    try:
      os.chown(foreign, 65534, 65534)
      _age(foreign)
    except OSError:  # a user namespace maps no uid 65534 (scripts/without_namespaces)
      shutil.rmtree(foreign)
      foreign = None
  before = sorted(os.listdir(tmp_path))
  assert scratch.sweep_dead(PREFIX, str(tmp_path)) == [dead]
  assert sorted(os.listdir(tmp_path)) == sorted(set(before) - {os.path.basename(dead)})
  if foreign is not None:
    assert os.path.isdir(foreign)


def test_a_base_that_cannot_be_read_sweeps_nothing(tmp_path):
  assert scratch.sweep_dead(PREFIX, str(tmp_path / 'missing')) == []


def test_release_removes_the_dir_and_drops_the_lock(tmp_path):
  held = scratch.held_tempdir(PREFIX, str(tmp_path))
  assert os.path.basename(held.path).startswith(PREFIX)
  assert oct(os.stat(held.path).st_mode & 0o777) == oct(0o700)
  held.release()
  held.release()  # idempotent
  assert not os.path.exists(held.path) and held.fd == -1


@pytest.mark.timeout(60)
def test_a_replay_node_without_a_logdir_sweeps_a_killed_ones_checkpoints_and_removes_its_own(
    tmp_path, monkeypatch):
  """The replay node's Reverb checkpoint dir (no logdir to keep it in): a dead node's
  is swept when the next starts, the running node's holds a lock and is Reverb's
  alone, and it is gone once the node ends."""
  import tempfile  # pylint: disable=g-import-not-at-top
  from seedacme.nodes import replay  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  monkeypatch.setattr(scratch, 'sweep_dead', _sweep_into(seen := []))
  dead = scratch.held_tempdir(replay.REVERB_TMP_PREFIX)
  (tmp_path / os.path.basename(dead.path) / 'checkpoints').mkdir()
  os.close(dead.fd)  # its process is gone (SIGKILL closes it just so)
  _age(dead.path)
  served = {}

  def serve(stop_event, checkpoint_dir, **kwargs):  # the real server's place
    del stop_event, kwargs
    holder = os.path.dirname(checkpoint_dir)
    served.update(dir=checkpoint_dir, listing=sorted(os.listdir(tmp_path)),
                  empty=os.listdir(checkpoint_dir) == [],
                  swept=scratch.sweep_dead(replay.REVERB_TMP_PREFIX, str(tmp_path)),
                  holder_files=sorted(os.listdir(holder)))
    _age(holder)
    served['swept_old'] = scratch.sweep_dead(replay.REVERB_TMP_PREFIX, str(tmp_path))

  monkeypatch.setattr(replay, 'serve_replay', serve)
  monkeypatch.setattr(replay.lp, 'get_port_from_address', lambda address: 1)
  node = replay.ReplayNode(lambda: [], supervise=False)
  monkeypatch.setattr(node, '_address', type('A', (), {'resolve': lambda self: 'x:1'})())
  node.run()
  assert seen == [dead.path]  # swept before the new dir was made
  assert served['empty'] and os.path.basename(served['dir']) == 'checkpoints'
  assert served['listing'] == [os.path.basename(os.path.dirname(served['dir']))]
  assert served['holder_files'] == [scratch.HELD, 'checkpoints']
  assert served['swept'] == [] and served['swept_old'] == []  # held while it serves
  assert os.listdir(tmp_path) == []  # its own, gone at its end


def _sweep_into(seen):
  real = scratch.sweep_dead

  def sweep(prefix, base=None):
    removed = real(prefix, base)
    seen.extend(removed)
    return removed
  return sweep
