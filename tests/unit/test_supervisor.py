"""Supervisor restarts: a warm standby takes over from a killed child; crash loops back off.

The standby is a process started before the kill (its pid is known beforehand) that
has imported its modules and waits; when the working child is killed it is the one
that runs the target next, and every process is gone once the supervisor stops.
"""

import os
import signal
import sys
import tempfile
import threading
import time

import psutil
import pytest

from seedacme.runtime import scratch
from seedacme.runtime.supervisor import CHILD_TMP_PREFIX, Supervisor


def _targets():
  """The children's targets, made here so cloudpickle sends them by value."""

  def record_and_wait(stop_event, directory):
    with open(os.path.join(directory, str(os.getpid())), 'w') as f:
      f.write('started')
    stop_event.wait(60)

  def fail_at_once(stop_event, directory):
    del stop_event
    with open(os.path.join(directory, str(os.getpid())), 'w') as f:
      f.write('started')
    raise SystemExit(3)

  return record_and_wait, fail_at_once


def _started(directory):
  return sorted(int(p) for p in os.listdir(directory))


def _created(pid):
  return psutil.Process(pid).create_time()


@pytest.mark.timeout(90)
def test_a_waiting_standby_takes_over_from_a_killed_child(tmp_path, wait_until):
  stop = threading.Event()
  # A standby 1 s after its child (the default, 10 s, spent 20 of the test's 21 s
  # waiting for the two standbys); still past crash_loop_s, so the child killed once
  # its standby is up has outlived it and the standby takes over.
  sup = Supervisor(_targets()[0], {'directory': str(tmp_path)}, 'test', stop_event=stop,
                   standby_imports=('json',), crash_loop_s=0.5, standby_delay_s=1.0)
  thread = threading.Thread(target=sup.run)
  thread.start()
  try:
    assert wait_until(lambda: len(_started(tmp_path)) == 1 and sup.standby is not None)
    first, standby = sup.child, sup.standby
    assert _started(tmp_path) == [first.pid]  # the standby has not run the target
    # Started standby_delay_s after its child, not with it (process start times, 10 ms).
    assert _created(standby.pid) - _created(first.pid) >= 0.9
    os.kill(first.pid, signal.SIGKILL)
    assert wait_until(lambda: len(_started(tmp_path)) == 2)
    assert sorted(_started(tmp_path)) == sorted([first.pid, standby.pid])
    assert sup.child.pid == standby.pid
    assert wait_until(lambda: sup.standby is not None and sup.standby.pid != standby.pid)
    pids = [sup.child.pid, sup.standby.pid]
  finally:
    stop.set()
    thread.join(30)
  assert not thread.is_alive()
  assert not [p for p in pids if psutil.pid_exists(p) and
              psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(90)
def test_a_crash_loop_backs_off_instead_of_using_the_standby(tmp_path, wait_until):
  stop = threading.Event()
  sup = Supervisor(_targets()[1], {'directory': str(tmp_path)}, 'test', stop_event=stop,
                   standby_imports=('json',), restart_backoff_s=0.5, crash_loop_s=30.0)
  assert not _run_until_started(sup, stop, tmp_path, wait_until, 3)
  # Each restart waited for the backoff (a standby taking over would start at once).
  starts = sorted(os.stat(os.path.join(tmp_path, p)).st_mtime for p in os.listdir(tmp_path))
  assert len(starts) >= 3
  assert min(b - a for a, b in zip(starts, starts[1:])) >= 0.4, starts


@pytest.mark.timeout(90)
def test_children_dying_at_start_in_a_row_make_it_give_up(tmp_path):
  sup = Supervisor(_targets()[1], {'directory': str(tmp_path)}, 'test',
                   stop_event=threading.Event(), restart_backoff_s=0.05,
                   give_up_after=3, short_run_s=60.0)
  with pytest.raises(RuntimeError, match=r'test: 3 children in a row died within 60s .*'
                     r'exit code 3'):
    sup.run()
  assert len(_started(tmp_path)) == 3
  assert sup.child.poll() is not None


@pytest.mark.timeout(90)
def test_children_that_ran_past_short_run_s_do_not_count(tmp_path, wait_until):
  """The same failing child with short_run_s 0: every death is past it, none counts."""
  stop = threading.Event()
  sup = Supervisor(_targets()[1], {'directory': str(tmp_path)}, 'test', stop_event=stop,
                   restart_backoff_s=0.05, max_backoff_s=0.05, give_up_after=3,
                   short_run_s=0.0)
  assert not _run_until_started(sup, stop, tmp_path, wait_until, 5)


def _run_until_started(sup, stop, directory, wait_until, children):
  """Runs `sup` on a thread until `children` children have started, then stops it;
  returns what it raised ([] if nothing)."""
  errors = []

  def run():
    try:
      sup.run()
    except RuntimeError as e:
      errors.append(e)
  thread = threading.Thread(target=run)
  thread.start()
  try:
    assert wait_until(lambda: len(_started(directory)) >= children)
  finally:
    stop.set()
    thread.join(30)
  assert not thread.is_alive()
  return errors


def _more_targets():
  """More targets, made here (sent by value, as `_targets`)."""

  def slow_crash(stop_event, directory, run_s):
    """Runs `run_s`, then dies with exit code 76 (an env step hung), recording its start."""
    with open(os.path.join(directory, str(os.getpid())), 'w') as f:
      f.write('started')
    stop_event.wait(run_s)
    os._exit(76)  # pylint: disable=protected-access

  def record_restart_and_env(stop_event, directory, fail_first):
    """Writes `restart_count() OMP_NUM_THREADS` to a file; the first `fail_first` die."""
    from seedacme.runtime import supervisor  # pylint: disable=g-import-not-at-top
    count = supervisor.restart_count()
    with open(os.path.join(directory, str(os.getpid())), 'w') as f:
      f.write(f'{count} {os.environ.get("OMP_NUM_THREADS")}')
    if count < fail_first:
      os._exit(1)  # pylint: disable=protected-access
    stop_event.wait(60)

  def leave_a_temp_file(stop_event, directory):
    """Leaves a file in its temp dir (as TF's autograph does until a clean exit) and
    records the dir, then waits."""
    import tempfile  # pylint: disable=g-import-not-at-top
    with tempfile.NamedTemporaryFile(delete=False):
      pass
    with open(os.path.join(directory, str(os.getpid())), 'w') as f:
      f.write(tempfile.gettempdir())
    stop_event.wait(60)

  return slow_crash, record_restart_and_env, leave_a_temp_file


_slow_crash_target, _record_restart_and_env, _leave_a_temp_file = _more_targets()


@pytest.mark.timeout(90)
def test_a_slow_crash_loop_gives_up_after_max_deaths_within_the_window(tmp_path):
  # Every child outlives short_run_s, so the fast rule never counts it: before, such a
  # loop (a child dying every 6 minutes against 300 s) was restarted for good.
  sup = Supervisor(_slow_crash_target, {'directory': str(tmp_path), 'run_s': 0.3}, 'test',
                   stop_event=threading.Event(), restart_backoff_s=0.05,
                   max_backoff_s=0.05, give_up_after=3, short_run_s=0.1,
                   max_deaths=4, death_window_s=60.0)
  with pytest.raises(RuntimeError, match=r'test: 4 children died within 60s .*exit code 76 '
                     r'\(an env step hung\).*crash loop'):
    sup.run()
  assert len(_started(tmp_path)) == 4
  assert sup.child.poll() is not None


@pytest.mark.timeout(90)
def test_deaths_older_than_the_window_do_not_count(tmp_path, wait_until):
  stop = threading.Event()
  sup = Supervisor(_slow_crash_target, {'directory': str(tmp_path), 'run_s': 0.3}, 'test',
                   stop_event=stop, restart_backoff_s=0.05, max_backoff_s=0.05,
                   short_run_s=0.1, max_deaths=3, death_window_s=0.5)
  assert not _run_until_started(sup, stop, tmp_path, wait_until, 6)


@pytest.mark.timeout(90)
def test_a_child_knows_its_restart_count_and_gets_the_child_env(tmp_path, wait_until,
                                                               monkeypatch):
  monkeypatch.setenv('OMP_NUM_THREADS', '8')
  stop = threading.Event()
  sup = Supervisor(_record_restart_and_env, {'directory': str(tmp_path), 'fail_first': 2},
                   'test', stop_event=stop, restart_backoff_s=0.05,
                   child_env={'OMP_NUM_THREADS': '1'})
  assert not _run_until_started(sup, stop, tmp_path, wait_until, 3)
  records = sorted(open(os.path.join(tmp_path, p)).read() for p in os.listdir(tmp_path))
  assert records == ['0 1', '1 1', '2 1'], records


@pytest.mark.timeout(90)
def test_each_child_has_its_own_temp_dir_removed_when_it_ends_even_killed(
    tmp_path, wait_until, monkeypatch):
  # TF leaves ~50 autograph files in the temp dir of every process killed (no atexit).
  temp_root = tmp_path / 'tmp'
  temp_root.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp_root))
  records = tmp_path / 'records'
  records.mkdir()
  stop = threading.Event()
  sup = Supervisor(_leave_a_temp_file, {'directory': str(records)}, 'test',
                   stop_event=stop, restart_backoff_s=0.05)
  thread = threading.Thread(target=sup.run)
  thread.start()
  try:
    assert wait_until(lambda: len(_started(records)) == 1)
    first = sup.child.pid
    first_dir = open(records / str(first)).read()
    assert os.path.dirname(first_dir) == str(temp_root)  # its own dir, under the root
    # What it left is there while it runs (beside the lock that says it lives).
    assert sorted(os.listdir(first_dir))[0] == '.held' and len(os.listdir(first_dir)) == 2
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: len(_started(records)) == 2)
    second_dir = open(records / str(sup.child.pid)).read()
    assert second_dir != first_dir and os.path.isdir(second_dir)
    assert wait_until(lambda: not os.path.exists(first_dir))  # the killed one's: gone
  finally:
    stop.set()
    thread.join(30)
  assert not thread.is_alive()
  assert os.listdir(temp_root) == []  # the stopped one's too


_KILLED_PROGRAM = """
import sys, threading
from seedacme.runtime import scratch
from seedacme.runtime.supervisor import CHILD_TMP_PREFIX, Supervisor

def wait(stop_event):
  stop_event.wait(120)

Supervisor(wait, {}, 'killed', stop_event=threading.Event()).run()
"""


@pytest.mark.timeout(90)
def test_dirs_of_a_program_killed_whole_are_swept_by_the_next_supervisor(
    tmp_path, wait_until, monkeypatch):
  """SIGKILL to a supervisor and its child (an OOM kill, `scancel -s KILL`) runs no
  cleanup; the next supervisor under that TMPDIR removes what they left, and not the
  dir of a supervisor still running there."""
  temp_root = tmp_path / 'tmp'
  temp_root.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(temp_root))
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  killed = psutil.Popen([sys.executable, '-c', _KILLED_PROGRAM], cwd=repo,
                        env=dict(os.environ, TMPDIR=str(temp_root)))
  try:
    assert wait_until(lambda: len(killed.children()) == 1 and os.listdir(temp_root), 60)
    left = str(temp_root / os.listdir(temp_root)[0])
    child = killed.children()[0]
    for proc in (killed, child):
      proc.kill()
    killed.wait(10)
    assert wait_until(lambda: not child.is_running() or child.status() == 'zombie', 10)
    assert os.path.isdir(left)  # nothing cleaned up
    then = time.time() - 2 * scratch.MIN_AGE_S
    os.utime(left, (then, then))
    records = tmp_path / 'records'
    records.mkdir()
    stop = threading.Event()
    sup = Supervisor(_leave_a_temp_file, {'directory': str(records)}, 'next',
                     stop_event=stop)
    thread = threading.Thread(target=sup.run)
    thread.start()
    try:
      assert wait_until(lambda: len(_started(records)) == 1)
      mine = open(records / str(sup.child.pid)).read()
      assert os.listdir(temp_root) == [os.path.basename(mine)]  # the killed one's: gone
      # A second supervisor starting now leaves the running one's dir alone, however old.
      os.utime(mine, (then, then))
      assert scratch.sweep_dead(CHILD_TMP_PREFIX) == [] and os.path.isdir(mine)
    finally:
      stop.set()
      thread.join(30)
    assert not thread.is_alive()
  finally:
    if killed.is_running():
      for proc in killed.children(recursive=True) + [killed]:
        proc.kill()
