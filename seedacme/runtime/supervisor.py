"""Keeps a node's work alive: runs it in a child process and restarts it when it dies.

Launchpad's local launcher treats any node process that dies as a failure of the whole
program. Users run for days on preemptible machines, so seedacme's actor, evaluator,
central and replay nodes are *supervisors*: the Launchpad node process starts the real work in a child
process (`python -m seedacme.runtime.supervisor`, the target and its arguments pickled on
stdin) and starts a new child when one dies -- `kill -9` included. A new actor child
draws a new run id, so the server resets its envs; a new central child restores the
latest checkpoint and binds the same Courier port, and actors reconnect; a new replay
child serves the same port and loads the latest Reverb checkpoint, if its node makes
them (`serve_replay`), and the central node's writers and dataset reconnect.

On Launchpad's stop signal the supervisor asks the child to stop (SIGTERM), waits its
node's grace (`stop_timeout_s`: the central node's is longer, its `finish` joins the
learner and writes the last checkpoint), then kills it: nothing is left behind.

Restarts are not forever: a child that refuses to run (`fatal`), ten dying in a row
within 300 s of their start, or `max_deaths` deaths within any `death_window_s` (a
slow crash loop that outlives the fast rule) end the node with an error naming the
count. A child learns how many restarts came before it (`restart_count()`: an actor
derives its env seeds from it, so a restarted actor does not replay the same failure)
and may be given its own environment (`child_env`: an actor's thread limits, whatever
launcher started the node). Exit codes that name a reason (`EXIT_REASONS`, e.g. an env
step that hung) are logged by name.

Each child gets its own temp dir (`TMPDIR`), removed once the child has ended however
it ended: TensorFlow writes every function autograph converts to
`/tmp/__autograph_generated_file*.py` and removes them only at a clean exit, so each
child killed (a grace exceeded, `kill -9`, a crash) left its ~50 there (435 piled up
in /tmp over two days of test suites and benches). A program SIGKILLed whole removes
nothing: the dirs are `seedacme.runtime.scratch`'s, swept by the next supervisor.

A *standby* (`standby_imports`; the replay and central nodes with
`ProgramConfig.standby_restarts`) is a second child started ahead of
need: it has read its target and imported the listed modules, and waits for one byte
on stdin before running. When the working child dies, the standby runs at once and a
new one is started behind it. A replay restart cost ~5 s of importing Reverb and
TensorFlow before the new server could bind its port (README, "Fault table").

Start-up marks (`seedacme.runtime.startup`): the supervisor logs `supervising` when it
starts, a child `imported` once its target is unpickled and told to run, each under
the node's name (`bench/startup.py` reads them).

Why ~320 lines: the restart policy (backoff, the fast and the windowed give-up rules,
named exit reasons), the standby child and the child entry point are one state machine
over one child process; split, each part would need the others' state.
"""

import atexit
import collections
import faulthandler
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Mapping

from absl import logging
import cloudpickle

from seedacme.runtime import scratch
from seedacme.runtime import startup
from seedacme.runtime.lifecycle import default_stop_event

# A child exits with this when its error has `fatal = True` (restarting cannot fix it,
# e.g. `devices.AcceleratorMissingError`): the supervisor then fails instead of restarting.
FATAL_EXIT_CODE = 78
# Exit codes children use to name why they ended (logged with the restart).
ENV_FAULT_EXIT_CODE = 75  # an env raised (seedacme.actor.env_actor)
ENV_HUNG_EXIT_CODE = 76  # an env step exceeded its limit (seedacme.actor.env_actor)
EXIT_REASONS = {FATAL_EXIT_CODE: 'refused to run', ENV_FAULT_EXIT_CODE: 'an env raised',
                ENV_HUNG_EXIT_CODE: 'an env step hung'}
CHILD_TMP_PREFIX = 'seedacme_child_'  # each child's TMPDIR (`scratch.held_tempdir`)
_RUN = b'r'  # the byte that tells a waiting standby to run (then 8 bytes: restart count)
_restart_count = 0  # in a child: restarts of its node before it


def restart_count() -> int:
  """In a supervised child: how many children of its node died before it (0 elsewhere)."""
  return _restart_count


def _span(seconds: float) -> str:
  return f'{seconds:.0f}s' if seconds < 120 else f'{seconds / 3600:.3g} h'


def describe_exit(code: int) -> str:
  """`exit code 76 (an env step hung)`, or just the code when it names no reason."""
  reason = EXIT_REASONS.get(code)
  return f'exit code {code}' + (f' ({reason})' if reason else '')


class Supervisor:
  """Runs `target(stop_event=..., **kwargs)` in a child process, restarting it on death.

  `standby_imports`: keep a standby child with these modules imported (module
  docstring), started `standby_delay_s` after the working child (not to compete with
  its start-up); it takes over at once from a child that ran for over `crash_loop_s`.

  `give_up_after`: that many children in a row dying within `short_run_s` of their start
  is a failure a restart does not fix (seen: a learner failing at its first step, a
  replay node given another config's checkpoints, each restarted every 30 s for good):
  the supervisor then fails, as on a fatal error, naming the count and the exit code.
  With the backoff that is ~3 minutes of tries plus the children's start-ups.

  `max_deaths` within any `death_window_s` (sliding; default 20 in 6 h) also ends it:
  a child dying every 6 minutes passes the rule above and was restarted for good. A run
  that loses a child now and then (a preemption, an env that crashes once in a while)
  stays below it; any loop faster than one death per 18 minutes does not.

  `stop_timeout_s`: how long a stopping child may take after SIGTERM before it is
  killed (the node's grace). `child_env`: variables set in every child's environment.
  """

  def __init__(self, target: Callable[..., None], kwargs: Dict[str, Any], name: str,
               stop_event: threading.Event | None = None,
               restart_backoff_s: float = 1.0, max_backoff_s: float = 30.0,
               stop_timeout_s: float = 6.0, standby_imports: tuple = (),
               crash_loop_s: float = 10.0, standby_delay_s: float = 10.0,
               give_up_after: int = 10, short_run_s: float = 300.0,
               max_deaths: int = 20, death_window_s: float = 6 * 3600.0,
               child_env: Mapping[str, str] | None = None):
    self._payload = cloudpickle.dumps((target, kwargs, tuple(standby_imports), name))
    self._name = name
    self._stop = stop_event
    self._backoff = restart_backoff_s
    self._max_backoff = max_backoff_s
    self._stop_timeout_s = stop_timeout_s
    self._use_standby = bool(standby_imports)
    self._crash_loop_s = crash_loop_s
    self._standby_delay_s = standby_delay_s
    self._give_up_after = give_up_after
    self._short_run_s = short_run_s
    self._max_deaths = max_deaths
    self._death_window_s = death_window_s
    self._deaths = collections.deque()  # monotonic times of deaths within the window
    self._env = dict(os.environ, **(child_env or {}))
    self._tmpdirs: Dict[int, scratch.HeldDir] = {}  # child pid -> its TMPDIR, removed when it ends
    self.restarts = 0
    self.child: subprocess.Popen | None = None
    self.standby: subprocess.Popen | None = None

  def _start_child(self, standby: bool = False) -> subprocess.Popen:
    tmpdir = scratch.held_tempdir(CHILD_TMP_PREFIX)
    try:  # the child holds the dir's lock too (pass_fds): swept only once both are gone
      child = subprocess.Popen([sys.executable, '-m', 'seedacme.runtime.supervisor'],
                               stdin=subprocess.PIPE, pass_fds=(tmpdir.fd,),
                               env=dict(self._env, TMPDIR=tmpdir.path))
    except BaseException:
      tmpdir.release()
      raise
    self._tmpdirs[child.pid] = tmpdir
    child.stdin.write(len(self._payload).to_bytes(8, 'little') + self._payload)
    if standby:
      child.stdin.flush()  # kept open: one byte later says "run"
    else:
      child.stdin.write(self._run_message())
      child.stdin.close()
    logging.info('%s: started %s process %d', self._name,
                 'standby' if standby else 'child', child.pid)
    return child

  def _run_message(self) -> bytes:
    return _RUN + self.restarts.to_bytes(8, 'little')

  def _standby_takes_over(self, died_after_s: float | None) -> bool:
    """Whether the next child is the standby: a live one, and no crash loop."""
    return (self.standby is not None and self.standby.poll() is None
            and (died_after_s is None or died_after_s > self._crash_loop_s))

  def _next_child(self, died_after_s: float | None) -> subprocess.Popen:
    """The standby, told to run, when it takes over; a new child otherwise."""
    takes_over = self._standby_takes_over(died_after_s)
    standby, self.standby = self.standby, None
    if takes_over:
      try:
        standby.stdin.write(self._run_message())
        standby.stdin.close()
        logging.info('%s: standby process %d takes over', self._name, standby.pid)
        return standby
      except BrokenPipeError:  # it died just now
        pass
    if standby is not None:
      self._end(standby)
    return self._start_child()

  def _stop_child(self) -> None:
    if self.standby is not None:
      self._end(self.standby)
      self.standby = None
    self._end(self.child)

  def _release(self, child: subprocess.Popen) -> None:
    """Removes an ended child's temp dir."""
    tmpdir = self._tmpdirs.pop(child.pid, None)
    if tmpdir is not None:
      tmpdir.release()

  def _end(self, child: subprocess.Popen | None) -> None:
    if child is None:
      return
    try:
      self._stop_process(child)
    finally:
      if child.poll() is not None:
        self._release(child)

  def _stop_process(self, child: subprocess.Popen) -> None:
    if child.poll() is not None:
      return
    if child.stdin is not None and not child.stdin.closed:  # a waiting standby: EOF ends it
      try:
        child.stdin.close()
        child.wait(2.0)
        return
      except (BrokenPipeError, subprocess.TimeoutExpired):
        pass
    child.send_signal(signal.SIGTERM)
    try:
      child.wait(self._stop_timeout_s)
    except subprocess.TimeoutExpired:
      logging.warning('%s: child %d ignored SIGTERM for %.0fs; its stacks follow, then it '
                      'is killed', self._name, child.pid, self._stop_timeout_s)
      child.send_signal(signal.SIGUSR2)  # faulthandler: every thread's stack to the log
      time.sleep(0.5)
      child.kill()
      child.wait()

  def run(self) -> None:
    if self._stop is None:
      self._stop = default_stop_event()
    startup.mark(self._name, 'supervising')  # this (Launchpad node) process's start-up
    scratch.sweep_dead(CHILD_TMP_PREFIX)  # what a SIGKILLed program's children left
    backoff = self._backoff
    died_after_s = None
    short_deaths = 0  # in a row
    try:
      while not self._stop.is_set():
        self.child = self._next_child(died_after_s)
        started = time.monotonic()
        while self.child.poll() is None and not self._stop.wait(0.2):
          if (self._use_standby and self.standby is None
              and time.monotonic() - started >= self._standby_delay_s):
            self.standby = self._start_child(standby=True)
        died_after_s = time.monotonic() - started
        if self._stop.is_set():
          break
        self._release(self.child)
        code = self.child.returncode
        if code == 0:
          logging.info('%s: child %d finished', self._name, self.child.pid)
          return
        if code == FATAL_EXIT_CODE:
          raise RuntimeError(f'{self._name}: child {self.child.pid} refused to run (its '
                             f'error is logged above); not restarting it')
        if died_after_s > 60:
          backoff = self._backoff  # it ran a while: not a crash loop
        short_deaths = short_deaths + 1 if died_after_s < self._short_run_s else 0
        if short_deaths >= self._give_up_after:
          raise RuntimeError(
              f'{self._name}: {short_deaths} children in a row died within '
              f'{self._short_run_s:.0f}s of starting (the last, process {self.child.pid}, '
              f'with {describe_exit(code)}; its error is logged above); not restarting it')
        now_s = time.monotonic()
        self._deaths.append(now_s)
        while self._deaths and self._deaths[0] < now_s - self._death_window_s:
          self._deaths.popleft()
        if len(self._deaths) >= self._max_deaths:
          raise RuntimeError(
              f'{self._name}: {len(self._deaths)} children died within '
              f'{_span(self._death_window_s)} (the last, process {self.child.pid}, '
              f'with {describe_exit(code)}; its error is logged above); a crash loop, '
              'not restarting it')
        self.restarts += 1
        now = self._standby_takes_over(died_after_s)
        logging.warning('%s: child %d died (%s) after %.0fs; restart #%d %s', self._name,
                        self.child.pid, describe_exit(code), died_after_s, self.restarts,
                        'now (standby)' if now else f'in {backoff:.1f}s')
        if not now and self._stop.wait(backoff):
          break
        backoff = min(2 * backoff, self._max_backoff)
    finally:
      self._stop_child()


def exit_node() -> None:
  """Ends a Launchpad node process whose work is done (and stopped): exit code 0, now.

  Launchpad 0.5.0's `process_entry` answers SIGTERM with a countdown of 1-s SIGALRMs and
  never cancels it when the node function returns: a process whose interpreter teardown
  takes over a second (TensorFlow, gRPC) then dies of SIGALRM (exit code -14), which a
  Vertex replica would report as a failure (seen in the emulation, launchers/emulation.py).
  A supervisor has nothing left to tear down once its child is gone but its exit hooks
  (TensorFlow removes its autograph temp files there), which run first.
  """
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


def run_supervised(target: Callable[..., None], name: str,
                   child_env: Mapping[str, str] | None = None, **kwargs) -> None:
  """Launchpad node entry point: supervise `target(**kwargs)` (handles already resolved),
  its children started with `child_env` added to this process's environment."""
  Supervisor(target, kwargs, name, child_env=child_env).run()
  exit_node()


def _child_main() -> None:
  faulthandler.register(signal.SIGUSR2, all_threads=True)
  stdin = sys.stdin.buffer
  size = int.from_bytes(stdin.read(8), 'little')
  target, kwargs, standby_imports, name = cloudpickle.loads(stdin.read(size))
  for module in standby_imports:
    importlib.import_module(module)
  if stdin.read(1) != _RUN:  # a standby waits here; EOF: the supervisor is stopping
    atexit._run_exitfuncs()  # pylint: disable=protected-access  (TF's temp files)
    os._exit(0)
  # Run as `-m`, this is `__main__`: the count goes to the module the target imports.
  from seedacme.runtime import supervisor as module  # pylint: disable=g-import-not-at-top
  module._restart_count = int.from_bytes(stdin.read(8), 'little')  # pylint: disable=protected-access
  stop = threading.Event()

  def request_stop(*_):
    # Not stop.set() here: the handler runs on the main thread, which may be inside
    # stop.wait() holding the event's (non-reentrant) lock -- setting it from another
    # thread cannot deadlock.
    threading.Thread(target=stop.set, daemon=True).start()

  signal.signal(signal.SIGTERM, request_stop)
  signal.signal(signal.SIGINT, request_stop)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.use_absl_handler()
  absl_logging.set_verbosity(absl_logging.INFO)
  # The target unpickled (its modules imported) and told to run: a standby's mark
  # comes when it takes over (its `+seconds` then include the wait).
  startup.mark(name, 'imported')
  try:
    target(stop_event=stop, **kwargs)
  except BaseException as e:  # pylint: disable=broad-except
    if not getattr(e, 'fatal', False):
      raise
    # An error a restart cannot fix (e.g. no accelerator): tell the supervisor so.
    absl_logging.error('%s: %s', type(e).__name__, e)
    atexit._run_exitfuncs()  # pylint: disable=protected-access  (TF's temp files)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FATAL_EXIT_CODE)
  # The work is done and its results written. Run the exit hooks (TF removes its
  # autograph temp files there), then skip the rest of interpreter teardown: a Courier
  # client's destructor can block on a call still in flight to a busy server, and the
  # supervisor would then have to kill this process.
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


if __name__ == '__main__':
  _child_main()
