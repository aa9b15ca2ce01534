"""The actor's Courier path (`seedacme.actor.transport.RpcTransport`) on a connection
the server's end has dropped: a long-unanswered call sends `ping`s on the same
connection, whose reset fails the call, which is then retried (issue 37: a partition
left actors waiting for good on a half-open connection)."""

import threading
from concurrent import futures

import numpy as np
import pytest

from seedacme.actor import transport
from seedacme.types import FIRST, Mode
from seedacme.wire import courier_guard


class _HalfOpenClient:
  """A Courier client whose first `step` waits until a `ping` is sent on its connection
  (then fails as gRPC fails a reset connection's calls); later calls are answered."""

  def __init__(self):
    self.futures = self
    self.pings = 0
    self.calls = 0
    self._stuck: futures.Future | None = None

  def step(self, request):
    self.calls += 1
    future = futures.Future()
    if self.calls == 1:
      self._stuck = future
    else:
      request = courier_guard.accept(request, 'step')  # as Courier carries it
      future.set_result(courier_guard.plain({'action': np.zeros(len(request['ids'][0]),
                                                                 np.int32)}))
    return future

  def ping(self):
    self.pings += 1
    if self._stuck is not None and not self._stuck.done():
      self._stuck.set_exception(RuntimeError('Socket closed'))
    return futures.Future()


def _step(path):
  return path.step(np.arange(2), np.ones(2, np.int64), np.zeros((2, 3), np.float32),
                   np.zeros(2, np.float32), np.ones(2, np.float32),
                   np.full(2, FIRST, np.int8), Mode.TRAIN)


@pytest.mark.timeout(30)
def test_an_unanswered_call_probes_its_connection_and_is_retried(monkeypatch):
  monkeypatch.setattr(transport, 'PROBE_INTERVAL_S', 0.5)
  client = _HalfOpenClient()
  rpc = transport.RpcTransport(client, threading.Event(), 'actor 0')
  reply = _step(rpc)
  assert reply['action'].shape == (2,)
  assert client.pings == 1 and client.calls == 2  # probed once, then sent again


@pytest.mark.timeout(30)
def test_a_client_without_ping_is_not_probed(monkeypatch):
  monkeypatch.setattr(transport, 'PROBE_INTERVAL_S', 0.2)

  class _Own:  # an actor's own inference: `futures.step` only, answered late
    def __init__(self):
      self.futures = self

    def step(self, request):
      future = futures.Future()
      threading.Timer(1.0, future.set_result,
                      [{'action': np.zeros(len(request['ids'][0]), np.int32)}]).start()
      return future

  reply = _step(transport.RpcTransport(_Own(), threading.Event(), 'actor 0'))
  assert reply['action'].shape == (2,)


_SERVER = '''
import sys, time
import courier
server = courier.Server('central', port=7001)
def step(request):
  if sys.argv[1] == 'hang':
    print('request', flush=True)  # received (and acknowledged): now wait for good
    time.sleep(3600)
  return {'action': [0, 0]}
server.Bind('step', step)
server.Bind('ping', lambda *args: True)
server.Start()
print('serving', flush=True)
time.sleep(3600)
'''
_CLIENT = '''
import sys, threading, time
import numpy as np
import courier
from seedacme.actor import transport
from seedacme.types import FIRST, Mode
transport.PROBE_INTERVAL_S = float(sys.argv[1])
rpc = transport.RpcTransport(courier.Client('10.77.0.2:7001'), threading.Event(), 'actor')
print('calling', flush=True)
reply = rpc.step(np.arange(2), np.ones(2, np.int64), np.zeros((2, 3), np.float32),
                 np.zeros(2, np.float32), np.ones(2, np.float32), np.full(2, FIRST, np.int8),
                 Mode.TRAIN)
print('answered', reply['action'], flush=True)
'''


@pytest.mark.timeout(120)
def test_a_call_left_on_a_connection_the_server_dropped_during_a_partition_is_retried(
    tmp_path):
  # A half-open connection, made on purpose: the actor's call waits on host B; B's
  # link goes down; the server on A dies (its goodbye lost in the partition) and a new
  # one serves the same port; the link comes back. The actor is answered by the new
  # server. (A control with probes off waited on the dead connection in the first
  # runs, but was answered in 8 of 12 later ones, its call apparently sent again by
  # gRPC itself: not asserted.)
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from tests.emulated_hosts import EmulatedHosts, skip_reason  # pylint: disable=g-import-not-at-top
  why = skip_reason()
  if why:
    pytest.skip(f'emulated hosts: {why}')

  def text(name):
    with open(tmp_path / name) as f:
      return f.read()

  def wait_for(name, word, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if os.path.exists(tmp_path / name) and word in text(name):
        return True
      time.sleep(0.2)
    return False

  with EmulatedHosts(['a', 'b']) as hosts:
    old = hosts.run('a', [sys.executable, '-c', _SERVER, 'hang'], log=str(tmp_path / 'old'))
    assert wait_for('old', 'serving', 60)
    hosts.run('b', [sys.executable, '-c', _CLIENT, '1'], log=str(tmp_path / 'probing'))
    assert wait_for('old', 'request', 60)  # the call reached the old server, and waits
    time.sleep(1)  # their acknowledgements delivered: nothing left to send on B's side
    hosts.link('b', up=False)
    hosts.signal(old, 9)
    assert hosts.wait(old, 10) is not None
    hosts.run('a', [sys.executable, '-c', _SERVER, 'answer'], log=str(tmp_path / 'new'))
    assert wait_for('new', 'serving', 60)
    hosts.link('b', up=True)
    assert wait_for('probing', 'answered', 30), text('probing')


@pytest.mark.timeout(60)
def test_an_actor_never_answered_connects_soon_after_the_server_starts():
  # Issue 48: actors start before the central node serves. A call on a channel whose
  # server is not listening waits out gRPC's backoff (answered 3.5 s after a server
  # started 6 s late, fresh clients and all); a never-answered actor makes no call
  # before the port accepts a TCP connection (`wait_for_port`).
  import time  # pylint: disable=g-import-not-at-top
  import courier  # pylint: disable=g-import-not-at-top
  import portpicker  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  path = transport.InferencePath(courier.Client(f'localhost:{port}'), 0, 2, threading.Event(),
                                 transport='courier')
  server = courier.Server(port=port)
  server.Bind('step', courier_guard.served(
      lambda request: {'action': np.zeros(2, np.int32)}, 'step'))
  server.Bind('ping', lambda *args: True)
  started = []
  def start():
    server.Start()
    started.append(time.monotonic())
  timer = threading.Timer(6.0, start)
  timer.start()
  try:
    reply = _step(path)
    answered = time.monotonic()
    assert reply['action'].shape == (2,)
    assert answered - started[0] < 2.0, answered - started[0]
  finally:
    timer.join()
    server.Stop()
    server.Join()
