"""A Reverb server that goes away under its clients (the replay node crashed): the
learner's dataset, the trajectory writer and R2D2's priority updates call it an outage
(`reverb_errors.is_server_away`) and wait it out instead of raising, and they still
raise real errors. A server that stops answering (SIGSTOP) holds R2D2's priority
update no longer than its timeout, with at most one call outstanding.

The server of the kill tests is a subprocess, SIGKILLed as a crashing replay node is.
The server lost during the dataset's signature call is made deterministic by stopping
it (SIGSTOP) before the call and killing it while the call waits: the call then fails
with 'Connection reset by peer'. The exact error of the original failure ('Transport
closed', from a call started on a connection that was closing) depends on a race, so
that one is injected.
"""

import logging
import os
import signal
import threading
import time

import numpy as np
import portpicker
import pytest

from tests.unit.subprocess_server import ServerProcess

_SERVER = '''
import sys, time
import reverb, tensorflow as tf
server = reverb.Server([reverb.Table.queue('q', 1000, signature={'x': tf.TensorSpec((3,), tf.float32)})],
                       port=int(sys.argv[1]))
server.wait()
'''


@pytest.fixture
def servers(tmp_path):
  """`start(port) -> ServerProcess`, answering; every server started is killed after."""
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.reverb_errors import server_answers  # pylint: disable=g-import-not-at-top
  started = []

  def start(port: int) -> ServerProcess:
    server = ServerProcess(_SERVER, [str(port)], str(tmp_path / 'server.log'))
    started.append(server)
    client = reverb.Client(f'localhost:{port}')
    deadline = time.monotonic() + 60
    while not server_answers(client, 2):
      assert server.proc.poll() is None, open(tmp_path / 'server.log').read()[-2000:]
      assert time.monotonic() < deadline, 'the Reverb server did not come up'
      time.sleep(0.1)
    return server

  yield start
  for server in started:
    server.kill()


def _insert(client, n: int, value: float = 1.0) -> None:
  """Inserts `n` items `{'x': [value] * 3}` into table 'q'."""
  writer = client.trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=60_000)
  try:
    for _ in range(n):
      writer.append({'x': np.full(3, value, np.float32)})
      writer.create_item('q', 1.0, {'x': writer.history['x'][-1]})
    writer.flush(timeout_ms=10_000)
  finally:
    writer.close()


@pytest.fixture
def absl_info_logs(caplog):
  """Records absl's log lines from INFO up (`ReverbBatches` logs through absl)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  caplog.set_level(logging.INFO, logger='absl')
  yield caplog
  absl_logging.set_verbosity(verbosity)


def test_is_server_away_tells_outages_from_real_errors():
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.reverb_errors import is_server_away  # pylint: disable=g-import-not-at-top
  away = [RuntimeError('Transport closed'), RuntimeError('Socket closed'),
          RuntimeError('Connection reset by peer'),
          RuntimeError('failed to connect to all addresses'),
          reverb.errors.DeadlineExceededError('ServerInfo call did not complete'),
          tf.errors.UnavailableError(None, None, 'Socket closed'),
          ConnectionError('the stream is lost')]
  real = [RuntimeError('Priority table nope was not found'),
          ValueError('Server at localhost:1 does not contain any table named q.'),
          tf.errors.InvalidArgumentError(None, None, 'bad shape'), KeyError('q')]
  assert [e for e in away if not is_server_away(e)] == []
  assert [e for e in real if is_server_away(e)] == []


@pytest.mark.timeout(150)
def test_batches_answer_none_while_the_server_is_killed_and_sample_after_a_restart(
    servers, absl_info_logs, wait_until):
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  server = servers(port)
  client = reverb.Client(f'localhost:{port}')
  _insert(client, 4)
  batches = ReverbBatches(f'localhost:{port}', 'q', 4, timeout_ms=500)
  try:
    batch = None

    def sampled():
      nonlocal batch
      batch = batches.next()
      return batch is not None

    assert wait_until(sampled, 30)
    assert batch['x'].shape == (4, 3)
    # Killed between two `next` calls, with the iterator streaming from it: Reverb's
    # sampler then waits for a new server, and `next` must not wait with it.
    server.kill()
    started = time.monotonic()
    assert batches.next() is None
    assert batches.next() is None
    assert time.monotonic() - started < 15
    server = servers(port)  # restarted on the same port, empty
    _insert(client, 4, value=2.0)
    assert wait_until(sampled, 60)
    assert float(batch['x'][0, 0]) == 2.0  # from the new server
  finally:
    batches.close()
  messages = [r.getMessage() for r in absl_info_logs.records]
  assert len([m for m in messages if 'unreachable' in m]) == 1, messages  # logged once
  assert len([m for m in messages if 'sampling again' in m]) == 1, messages


def _judged_errors(monkeypatch) -> list:
  """Records every error `ReverbBatches.next` judged with `is_server_away` (an error the
  sampling thread handed over and `next` took), so a test waits for the judgement
  itself rather than a number of `next` calls: under Bazel's parallel tests the
  thread's signature call can outlast `next`'s own timeout (a flake seen in CI)."""
  from seedacme.trajectories import datasets  # pylint: disable=g-import-not-at-top
  judged = []
  real = datasets.is_server_away

  def recording(error):
    judged.append(error)
    return real(error)

  monkeypatch.setattr(datasets, 'is_server_away', recording)
  return judged


def _next_is_none_until(batches, condition, timeout_s: float) -> None:
  """Calls `batches.next()` until `condition()`; every call returns None within 15 s."""
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, 'the condition did not come about'
    started = time.monotonic()
    assert batches.next() is None  # not an exception
    assert time.monotonic() - started < 15


@pytest.mark.timeout(120)
def test_server_lost_during_the_signature_call_is_an_outage(servers, monkeypatch):
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.reverb_errors import is_server_away  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  server = servers(port)
  # An open connection to the server, as the learner's process has (the dataset's own
  # client shares it): the signature request goes out on it at once.
  client = reverb.Client(f'localhost:{port}')
  client.server_info(timeout=10)
  # Record what `server_info` (the call `from_table_signature` makes) raised.
  raised = []
  real_server_info = reverb.Client.server_info

  def recording_server_info(self, *args, **kwargs):
    try:
      return real_server_info(self, *args, **kwargs)
    except Exception as e:
      raised.append(e)
      raise

  monkeypatch.setattr(reverb.Client, 'server_info', recording_server_info)
  judged = _judged_errors(monkeypatch)
  # Stopped, the server takes the signature request but never answers it; killed while
  # the call waits (well within its 3 s deadline), it resets the connection under it.
  server.proc.send_signal(signal.SIGSTOP)
  killer = threading.Timer(1.0, server.kill)
  killer.start()
  batches = ReverbBatches(f'localhost:{port}', 'q', 4, timeout_ms=3000)
  try:
    _next_is_none_until(batches, lambda: judged, 60)
    killer.join()
    # The scenario happened: the first signature call failed by the connection, not by
    # its deadline, and `next` took that error as an outage.
    assert raised and judged[0] is raised[0], (raised, judged)
    assert isinstance(raised[0], RuntimeError), raised
    assert all(is_server_away(e) for e in raised), raised
  finally:
    killer.cancel()
    killer.join()
    batches.close()


@pytest.mark.timeout(60)
def test_transport_closed_from_the_signature_call_is_an_outage(monkeypatch, wait_until):
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  server = reverb.Server([reverb.Table.queue(
      'q', 100, signature={'x': tf.TensorSpec((3,), tf.float32)})], port=None)
  batches = None
  try:
    client = reverb.Client(f'localhost:{server.port}')
    _insert(client, 4)
    # The error of the original failure: the first two signature calls (the dataset's)
    # find the connection closing.
    failures = []
    real_server_info = reverb.Client.server_info

    def closing_server_info(self, *args, **kwargs):
      if len(failures) < 2:
        failures.append(RuntimeError('Transport closed'))
        raise failures[-1]
      return real_server_info(self, *args, **kwargs)

    monkeypatch.setattr(reverb.Client, 'server_info', closing_server_info)
    judged = _judged_errors(monkeypatch)
    batches = ReverbBatches(f'localhost:{server.port}', 'q', 4, timeout_ms=300)
    _next_is_none_until(batches, lambda: len(judged) == 2, 30)
    assert judged == failures  # both taken by `next` as outages, in order
    assert wait_until(lambda: batches.next() is not None, 20)  # then samples
  finally:
    if batches is not None:
      batches.close()
    server.stop()


class _ClosingOnceClient:
  """A `reverb.Client` whose first trajectory writer fails its first append with
  'Transport closed' while the server answers (the connection, not the server, broke)."""

  def __init__(self, client):
    self._client = client
    self.failed = False

  def server_info(self, *args, **kwargs):
    return self._client.server_info(*args, **kwargs)

  def trajectory_writer(self, *args, **kwargs):
    writer = self._client.trajectory_writer(*args, **kwargs)
    if self.failed:
      return writer
    outer = self

    class _Writer:
      def __getattr__(self, name):
        return getattr(writer, name)

      def append(self, data):
        if not outer.failed:
          outer.failed = True
          raise RuntimeError('Transport closed')
        return writer.append(data)

    return _Writer()


@pytest.mark.timeout(60)
def test_writer_waits_out_transport_closed_instead_of_failing(wait_until):
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.writer import ReverbSequenceWriter  # pylint: disable=g-import-not-at-top
  server = reverb.Server([reverb.Table.queue(
      'q', 100, signature={'x': tf.TensorSpec((3,), tf.float32)})], port=None)
  writer = None
  try:
    real = reverb.Client(f'localhost:{server.port}')
    client = _ClosingOnceClient(real)
    writer = ReverbSequenceWriter(client, 'q', lambda s: [(1.0, {'x': x}) for x in s])
    writer.write(np.ones((4, 3), np.float32))
    assert writer.wait_until_written(20), (writer.error, writer.items_written)
    assert client.failed and writer.error is None
    assert writer.reconnects == 1
    assert wait_until(lambda: real.server_info(timeout=2)['q'].current_size == 4, 10)
  finally:
    if writer is not None:
      writer.close()
    server.stop()


class _PrioritiesClient:
  """`mutate_priorities` raises `error`; `server_info` answers (the server is up)."""

  def __init__(self, error):
    self.error = error

  def mutate_priorities(self, table, updates):
    raise self.error

  def server_info(self, timeout=None):
    return {}


def _r2d2_learner(client, table='q', **kwargs):
  import sonnet as snt  # pylint: disable=g-import-not-at-top
  from seedacme.agents.r2d2 import R2D2Config  # pylint: disable=g-import-not-at-top
  from seedacme.agents.r2d2.learning import R2D2Learner  # pylint: disable=g-import-not-at-top
  # Networks without variables: only the priority write-back is exercised.
  return R2D2Learner(snt.allow_empty_variables(snt.Module()),
                     snt.allow_empty_variables(snt.Module()), R2D2Config(), None, client,
                     table, **kwargs)


@pytest.mark.timeout(60)
def test_r2d2_priority_updates_count_outages_lost_and_raise_real_errors():
  keys, priorities = np.array([1, 2, 3]), np.array([0.1, 0.2, 0.3])
  learner = _r2d2_learner(_PrioritiesClient(RuntimeError('Transport closed')))
  learner._write_priorities(keys, priorities)  # pylint: disable=protected-access
  assert learner.priority_updates_lost == 3 and learner.priority_updates == 0
  learner = _r2d2_learner(_PrioritiesClient(RuntimeError('Priority table q was not found')))
  with pytest.raises(RuntimeError, match='not found'):
    learner._write_priorities(keys, priorities)  # pylint: disable=protected-access


_PRIORITIZED_SERVER = '''
import sys
import reverb, tensorflow as tf
server = reverb.Server([reverb.Table('p', reverb.selectors.Prioritized(0.9),
                                     reverb.selectors.Fifo(), 1000,
                                     reverb.rate_limiters.MinSize(1),
                                     signature={'x': tf.TensorSpec((3,), tf.float32)})],
                       port=int(sys.argv[1]))
server.wait()
'''


def _all_threads_stopped(pid: int) -> bool:
  """Whether every thread of process `pid` is in the stopped state (after SIGSTOP)."""
  states = []
  for tid in os.listdir(f'/proc/{pid}/task'):
    try:
      with open(f'/proc/{pid}/task/{tid}/stat') as f:
        states.append(f.read().rsplit(')', 1)[1].split()[0])
    except OSError:
      continue
  return bool(states) and all(state in ('T', 't') for state in states)


@pytest.mark.timeout(120)
def test_r2d2_priority_updates_to_a_stopped_server_time_out_one_call_at_a_time(
    tmp_path, wait_until):
  """A replay server that stops answering (SIGSTOP) does not block the learner: each
  update waits at most its timeout, counts as lost, and no second call starts while
  the first is hung; once the server answers again, updates go through."""
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.reverb_errors import server_answers  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  server = ServerProcess(_PRIORITIZED_SERVER, [str(port)], str(tmp_path / 'server.log'))
  try:
    client = reverb.Client(f'localhost:{port}')
    assert wait_until(lambda: server_answers(client, 2), 60), \
        open(tmp_path / 'server.log').read()[-2000:]
    writer = client.trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=60_000)
    for _ in range(3):
      writer.append({'x': np.ones(3, np.float32)})
      writer.create_item('p', 1.0, {'x': writer.history['x'][-1]})
    writer.flush(timeout_ms=10_000)
    writer.close()
    keys = np.array([s[0].info.key for s in client.sample('p', num_samples=3)],
                    dtype=np.uint64)  # keys above 2**63 made a float64 array
    learner = _r2d2_learner(client, table='p', priority_timeout_s=1.0)
    learner._write_priorities(keys, np.array([0.5, 0.6, 0.7]))  # pylint: disable=protected-access
    assert (learner.priority_updates, learner.priority_updates_lost) == (3, 0)

    def update_threads():
      return [t for t in threading.enumerate() if t.name == 'priority-update']

    server.proc.send_signal(signal.SIGSTOP)
    # Every thread of the server stopped before the call (a busy machine may let a
    # server thread run on for a moment after the signal: a call in that moment was
    # answered at once, a flake under Bazel's parallel tests).
    assert wait_until(lambda: _all_threads_stopped(server.proc.pid), 10)
    started = time.monotonic()
    learner._write_priorities(keys, np.array([0.1, 0.2, 0.3]))  # pylint: disable=protected-access
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 5, (elapsed, learner.priority_updates_lost,
                               learner.priority_update_timeouts)
    assert learner.priority_updates_lost == 3 and learner.priority_update_timeouts == 1
    assert len(update_threads()) == 1
    for _ in range(3):  # the hung call is still out: these do not wait, nor start one
      started = time.monotonic()
      learner._write_priorities(keys, np.array([0.1, 0.2, 0.3]))  # pylint: disable=protected-access
      assert time.monotonic() - started < 0.5
    assert learner.priority_updates_lost == 12 and len(update_threads()) == 1
    server.proc.send_signal(signal.SIGCONT)
    assert wait_until(lambda: not update_threads(), 30)  # the hung call returned
    learner._write_priorities(keys, np.array([0.4, 0.5, 0.6]))  # pylint: disable=protected-access
    assert learner.priority_updates == 6 and learner.priority_updates_lost == 12
  finally:
    if server.proc.poll() is None:
      server.proc.send_signal(signal.SIGCONT)
    server.kill()
