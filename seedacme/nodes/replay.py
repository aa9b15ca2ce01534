"""The replay node: Reverb tables in a supervised, checkpointed process.

`ReplayNode` stands in for Launchpad's Reverb node (`lp.ReverbNode`: the same port
name, address and handle, a `reverb.Client` when dereferenced) with seedacme's
lifecycle (below); `serve_replay` is its child process's work: a Reverb server on the
node's port that loads the latest checkpoint after a crash. It marks its start-up
phases (`seedacme.runtime.startup`: `reverb_imported`, `serving`).

The node's Launchpad process imports neither Reverb nor TensorFlow (issue 48): it is
no `lp.ReverbNode` (whose module imports Reverb, which imports TensorFlow), and the
tables fn travels as cloudpickled bytes that only the process serving the tables
unpickles (the agent's module imports TensorFlow). Before, the supervisor took 9.7 s
(Catch V-trace, load 0.6-2.7 on 2 cores; 20 s at load ~4) to reach `supervising`, one
of up to four processes importing TensorFlow at once, and held ~435 MB for a process
that only waits on its child; now 1.2-1.3 s and 67 MB (`bench/startup.py`;
/proc/<pid>/status of a Catch R2D2 run, load ~2), and its child starts that much sooner.
"""

import os
import shutil
import threading
import time
from typing import Any, Callable

from absl import logging
import cloudpickle
import launchpad as lp
from launchpad.nodes import base as lp_base

from seedacme.runtime import scratch
from seedacme.runtime import startup
from seedacme.runtime.lifecycle import default_stop_event
from seedacme.runtime.supervisor import Supervisor, exit_node


# The port name of Launchpad's Reverb node (`launchpad.nodes.reverb.node`).
REVERB_PORT_NAME = 'reverb'


REVERB_TMP_PREFIX = 'seedacme_reverb_'  # a replay node's checkpoints without a logdir


class ReplayHandle(lp_base.Handle):
  """The replay node's handle: a `reverb.Client` of its server when dereferenced (as
  `lp.ReverbNode`'s handle; Reverb is imported by the process that dereferences it)."""

  def __init__(self, address: lp.Address):
    self._address = address

  def dereference(self):
    import reverb  # pylint: disable=g-import-not-at-top
    address = self._address.resolve()
    logging.info('Reverb client connecting to: %s', address)
    return reverb.Client(address)


class ReplayNode(lp.PyNode):
  """A Reverb node, supervised, checkpointed, and outliving its clients briefly.

  * Supervised (`supervise=True`): the Reverb server runs in a child process
    (`serve_replay`) that is restarted on the same port when it dies; the
    central node's writers and the learner's dataset reconnect by themselves.
  * Checkpointed (`checkpoint_interval_s`): the child writes a Reverb checkpoint this
    often, and a restarted child loads the latest one -- R2D2's and SAC's replay
    survives a crash. With `checkpoint_dir` (the program passes `<logdir>/replay` when
    it checkpoints) the directory outlives the program, so a resumed run (the same
    command on the same logdir) starts with the replay as of its last checkpoint, at
    most `checkpoint_interval_s` old; without it, a temporary directory that is removed
    when the node stops.
  * Grace period: Launchpad signals every node at once. If the Reverb server vanished
    first, a learner waiting inside a Reverb sample would block on a dead server
    instead of timing out normally and seeing the stop signal.
  """

  def __init__(self, priority_tables_fn, grace_s: float = 2.0, supervise: bool = True,
               checkpoint_interval_s: float | None = None, standby: bool = False,
               checkpoint_dir: str | None = None):
    super().__init__(self.run)
    # Unpickled only where the tables are served (module docstring).
    self._priority_tables_fn = cloudpickle.dumps(priority_tables_fn)
    self._address = lp.Address(REVERB_PORT_NAME)
    self.allocate_address(self._address)
    self.checkpoint_dir = checkpoint_dir
    self._grace_s = grace_s
    self._supervise = supervise
    self._checkpoint_interval_s = checkpoint_interval_s
    self._standby = standby  # a standby child with Reverb imported (seedacme.runtime.supervisor)

  def create_handle(self) -> ReplayHandle:
    return self._track_handle(ReplayHandle(self._address))

  @property
  def reverb_address(self) -> lp.Address:
    return self._address

  def run(self):
    # Reverb's default checkpointer makes a temp dir per server and never removes it.
    # Ours is held while this node lives and swept by the next replay node if the
    # program was SIGKILLed (`seedacme.runtime.scratch`).
    persistent = self.checkpoint_dir is not None
    held = None
    if persistent:
      os.makedirs(self.checkpoint_dir, exist_ok=True)
      checkpoint_dir = self.checkpoint_dir
    else:
      scratch.sweep_dead(REVERB_TMP_PREFIX)
      held = scratch.held_tempdir(REVERB_TMP_PREFIX)
      checkpoint_dir = os.path.join(held.path, 'checkpoints')  # Reverb's alone
      os.mkdir(checkpoint_dir, 0o700)
    port = lp.get_port_from_address(self._address.resolve())
    kwargs = dict(port=port, tables_fn=self._priority_tables_fn,
                  checkpoint_dir=checkpoint_dir, grace_s=self._grace_s,
                  checkpoint_interval_s=self._checkpoint_interval_s)
    try:
      if self._supervise:
        Supervisor(serve_replay, kwargs, 'replay',
                              standby_imports=('reverb',) if self._standby else ()).run()
      else:
        serve_replay(stop_event=None, **kwargs)
    finally:
      if held is not None:
        held.release()
    if self._supervise:
      exit_node()  # the server is stopped and its files gone (see exit_node)


def serve_replay(stop_event: threading.Event | None, port: int,
                 tables_fn: Callable[[], Any] | bytes, checkpoint_dir: str, grace_s: float,
                 checkpoint_interval_s: float | None) -> None:
  """Entry point of a (supervised) replay process: a Reverb server on `port`, its
  tables from `tables_fn` (or its cloudpickled bytes, unpickled here).

  The server loads the latest checkpoint under `checkpoint_dir` when there is one (a
  restart after a crash). With `checkpoint_interval_s` it writes a new checkpoint that
  often and deletes the older ones, so the directory holds at most one complete
  checkpoint besides the one being written.
  """
  import reverb  # pylint: disable=g-import-not-at-top
  if isinstance(tables_fn, bytes):
    tables_fn = cloudpickle.loads(tables_fn)
  startup.mark('replay', 'reverb_imported')
  if stop_event is None:
    stop_event = default_stop_event()
  restoring = bool(os.listdir(checkpoint_dir))
  server = None
  try:
    server = reverb.Server(
        tables=tables_fn(), port=port,
        checkpointer=reverb.checkpointers.DefaultCheckpointer(checkpoint_dir))
    client = reverb.Client(f'localhost:{port}')
    if restoring:
      sizes = {name: t.current_size for name, t in client.server_info(timeout=5).items()}
      logging.info('replay: restored the latest checkpoint: table sizes %s', sizes)
  except Exception as e:  # pylint: disable=broad-except
    if server is not None:
      server.stop()
    if not restoring:
      raise
    raise RuntimeError(
        f'replay: cannot restore the checkpoint in {checkpoint_dir} ({e}); it was written '
        'by tables of another shape (another agent or config on this logdir?): move it '
        'away to start with empty tables') from e
  startup.mark('replay', 'serving')
  try:
    while not stop_event.wait(checkpoint_interval_s or 3600.0):
      if checkpoint_interval_s is None:
        continue
      try:
        latest = client.checkpoint()
      except Exception:  # pylint: disable=broad-except
        logging.exception('replay: checkpoint failed (the next one is tried in %.0fs)',
                          checkpoint_interval_s)
        continue
      # Reverb names checkpoints by time under `checkpoint_dir`; keep only the newest.
      for entry in os.listdir(checkpoint_dir):
        path = os.path.join(checkpoint_dir, entry)
        if os.path.abspath(path) != os.path.abspath(latest) and os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
    time.sleep(grace_s)  # Outlive clients still stopping (see ReplayNode).
  finally:
    server.stop()
