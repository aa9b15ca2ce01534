"""What `run_local` shows a user: no Launchpad shutdown countdown, curve titles that name
the game or level.

Launchpad's worker manager counts down 'Waiting for workers to stop for 10s.' in the
launcher's stdout while the nodes stop; `seedacme.launchers.local.quiet_stop_countdown`
filters it at our side. The filter is checked on the worker manager's own countdown
method (the text it prints is read from the installed package, so a Launchpad that
changes the message fails here rather than printing again unnoticed), with its alarm
held and its notice to in-process nodes skipped, so the test process is not signalled.
"""

import inspect
import signal

import termcolor

from seedacme.launchers import local
from seedacme.run.curves import curve_title


def _countdown_manager(worker_manager):
  """A WorkerManager in its countdown state, built without the flags and signal
  handlers its constructor registers."""
  manager = object.__new__(worker_manager.WorkerManager)
  manager._termination_notice_secs = 10  # pylint: disable=protected-access
  manager._stop_counter = 0  # pylint: disable=protected-access
  manager._active_workers = {}  # pylint: disable=protected-access
  return manager


def test_launchpads_shutdown_countdown_stays_out_of_the_output(capsys, monkeypatch):
  from launchpad.launch import worker_manager  # pylint: disable=g-import-not-at-top
  assert 'Waiting for workers to stop for' in inspect.getsource(
      worker_manager.WorkerManager._stop_or_kill)  # pylint: disable=protected-access
  monkeypatch.delattr(worker_manager, 'print', raising=False)  # restored after the test
  monkeypatch.setattr(signal, 'alarm', lambda seconds: None)  # its next tick
  monkeypatch.setattr(worker_manager, '_signal_dispatcher', lambda sig: None)  # no nodes
  manager = _countdown_manager(worker_manager)
  manager._stop_or_kill()  # pylint: disable=protected-access
  assert 'Waiting for workers' in capsys.readouterr().out  # what a user saw before

  local.quiet_stop_countdown()
  local.quiet_stop_countdown()  # idempotent: one filter, not two
  for _ in range(3):
    manager._stop_or_kill()  # pylint: disable=protected-access
  assert capsys.readouterr().out == ''
  # Everything else it prints still reaches the user.
  worker_manager.print(termcolor.colored('\nKilling entire runtime.', 'blue'))
  worker_manager.print('Worker groups that did not terminate in time: [\'actor\']')
  out = capsys.readouterr().out
  assert 'Killing entire runtime.' in out and 'did not terminate in time' in out


def test_curve_titles_name_the_game_or_level():
  assert curve_title('vtrace', 'atari', 'Breakout') == 'vtrace on atari: Breakout'
  assert curve_title('vtrace', 'catch') == 'vtrace on catch'
  # run_local's title: the game or level the training envs ran, the env's default
  # when no flag named one.
  assert local.run_title(local.parse_args(['atari', 'vtrace', '2'])) == 'vtrace on atari: Pong'
  assert local.run_title(local.parse_args(
      ['atari', 'r2d2', '2', '--game', 'Breakout'])) == 'r2d2 on atari: Breakout'
  assert local.run_title(local.parse_args(
      ['dmlab', 'vtrace', '2', '--level', 'rooms_watermaze'])) == 'vtrace on dmlab: rooms_watermaze'
  assert local.run_title(local.parse_args(['catch', 'vtrace', '2'])) == 'vtrace on catch'
