"""The same-host data path: shared-memory segments, attach, refusals, faults, cleanup.

A real `InferenceServer` behind a real `ShmServer` (Unix socket, memfd segments); the
actor's side is `InferencePath` (what `EnvActor` calls), with a stand-in for the
Courier client that answers `shm_offer` and `step` in-process. The kill tests use real
processes and SIGKILL.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from seedacme.actor.transport import InferencePath, ServerAway, ShmTransport
from seedacme.run.accounting import ActingLog
from seedacme.serving.policy import PolicyStep, StatelessPolicy
from seedacme.serving.server import InferenceServer
from seedacme.serving.shm_server import ShmServer
from seedacme.types import FIRST, MID, EnvSpec, Mode
from seedacme.wire import shm
from seedacme.wire.protocol import InvalidRequestError
from tests.unit.central_stand_ins import InProcessClient

SPEC = EnvSpec((3,), 'float32', 5)
NUM_ENVS = 8


class _ObsPolicy(StatelessPolicy):
  """Action = round(observation[0]) + 1 for training envs, 0 for evaluation envs."""

  def act(self, observation, eval_mask, env_ids):
    action = np.where(eval_mask, 0, np.rint(observation[:, 0]) + 1).astype(np.int32)
    return PolicyStep(action, {}, ())


@pytest.fixture(name='serving')
def _serving():
  log = ActingLog()
  server = InferenceServer(_ObsPolicy(NUM_ENVS), SPEC, NUM_ENVS, None, max_batch_envs=1,
                           batch_timeout_s=0.0, acting=log)
  shm_server = ShmServer(server, SPEC, NUM_ENVS)
  yield server, shm_server, log
  shm_server.close()
  server.close()


def _fields(ids, value=1.0, step_type=MID):
  k = len(ids)
  return (np.asarray(ids), np.full(k, 7), np.full((k, 3), value, np.float32), np.zeros(k),
          np.ones(k), np.full(k, step_type))


def _memfds():
  """This process's open shared-memory segments."""
  out = []
  for fd in os.listdir('/proc/self/fd'):
    try:
      if 'seedacme-actor-segment' in os.readlink(f'/proc/self/fd/{fd}'):
        out.append(fd)
    except OSError:
      pass
  return out


@pytest.mark.timeout(60)
def test_requests_travel_through_shared_memory_and_are_served_and_counted(serving):
  server, shm_server, log = serving
  client = InProcessClient(server, shm_server)
  path = InferencePath(client, 4, 4, threading.Event(), 'auto', 'actor 1')
  try:
    reply = path.step(*_fields([4, 5, 6, 7], 2.0, FIRST), Mode.TRAIN)
    assert path.name == 'shm' and client.rpc_steps == 0  # Courier was not used for data
    np.testing.assert_array_equal(reply['action'], [3, 3, 3, 3])
    for value in range(1, 4):
      reply = path.step(*_fields([4, 5], float(value)), Mode.TRAIN)
      np.testing.assert_array_equal(reply['action'], [value + 1] * 2)
    reply = path.step(*_fields([6, 7], 3.0), Mode.EVAL)
    np.testing.assert_array_equal(reply['action'], [0, 0])
    assert log.env_steps(Mode.TRAIN) == 4 + 3 * 2 and log.env_steps(Mode.EVAL) == 2
    assert shm_server.attached_actors == 1
  finally:
    path.close()


@pytest.mark.timeout(60)
def test_courier_is_used_when_forced_or_not_offered(serving):
  server, shm_server, _ = serving
  forced = InferencePath(InProcessClient(server, shm_server), 0, 2, threading.Event(), 'courier')
  not_offered = InferencePath(InProcessClient(server, None), 2, 2, threading.Event(), 'auto')
  for path, ids in ((forced, [0, 1]), (not_offered, [2, 3])):
    reply = path.step(*_fields(ids, 1.0, FIRST), Mode.TRAIN)
    assert path.name == 'courier'
    np.testing.assert_array_equal(reply['action'], [2, 2])
  with pytest.raises(RuntimeError, match='offers no shared memory'):
    InferencePath(InProcessClient(server, None), 4, 2, threading.Event(), 'shm').step(
        *_fields([4, 5]), Mode.TRAIN)


@pytest.mark.timeout(60)
def test_bad_data_in_a_slot_is_refused_by_name_to_that_actor_only(serving):
  server, shm_server, _ = serving
  good = InferencePath(InProcessClient(server, shm_server), 0, 4, threading.Event(), 'shm')
  bad = InferencePath(InProcessClient(server, shm_server), 4, 4, threading.Event(), 'shm')
  try:
    good.step(*_fields([0, 1, 2, 3], 1.0, FIRST), Mode.TRAIN)
    bad.step(*_fields([4, 5, 6, 7], 1.0, FIRST), Mode.TRAIN)
    ids, run_ids, obs, reward, discount, step_type = _fields([4, 5])
    obs[1, 2] = np.nan
    with pytest.raises(InvalidRequestError, match=r'observation contains NaN or inf for envs \[5\]'):
      bad.step(ids, run_ids, obs, reward, discount, step_type, Mode.TRAIN)
    with pytest.raises(InvalidRequestError, match=r"env_ids \[2\] are not this actor's"):
      bad.step(*_fields([4, 2]), Mode.TRAIN)  # another actor's env
    with pytest.raises(InvalidRequestError, match=r'discount must lie in \[0, 1\]'):
      bad.step(ids, run_ids, np.zeros_like(obs), reward, discount * 3, step_type, Mode.TRAIN)
    # The refused actor and the other one keep being served.
    np.testing.assert_array_equal(bad.step(*_fields([4, 5], 2.0), Mode.TRAIN)['action'], [3, 3])
    np.testing.assert_array_equal(good.step(*_fields([0, 1], 0.0), Mode.TRAIN)['action'], [1, 1])
    assert server.requests_refused == 3
  finally:
    good.close()
    bad.close()


@pytest.mark.timeout(60)
def test_attach_refusals_name_the_problem(serving):
  server, shm_server, _ = serving
  stop = threading.Event()
  offer = shm_server.offer()
  stale = dict(offer, generation=offer['generation'] + 1)
  with pytest.raises(ConnectionRefusedError, match='stale generation'):
    ShmTransport.attach(stale, 0, 4, stop, 'actor')
  with pytest.raises(ConnectionRefusedError, match=r'env ids 6\.\.9 are unknown'):
    ShmTransport.attach(shm_server.offer(), 6, 4, stop, 'actor')
  offer = shm_server.offer()
  first = ShmTransport.attach(offer, 0, 4, stop, 'actor')
  try:
    forged = offer['ticket'][:-1] + ('1' if offer['ticket'][-1] == '0' else '0')
    with pytest.raises(ConnectionRefusedError, match='attach ticket not valid for pid'):
      ShmTransport.attach(dict(offer, ticket=forged), 4, 2, stop, 'actor')
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError, match='attached by another live actor'):
      ShmTransport.attach(shm_server.offer(), 2, 2, stop, 'actor')
    assert time.monotonic() - started < 10  # waited its grace, then refused
  finally:
    first.close()
  assert server.requests_refused == 0  # attach refusals are not request refusals


_ACTOR = '''
import json, sys, threading, numpy as np
from seedacme.actor.transport import ShmTransport
from seedacme.types import Mode
offer = json.loads(sys.stdin.readline())  # made for this process's pid
t = ShmTransport.attach(offer, 0, 2, threading.Event(), 'doomed actor')
t.step(np.array([0, 1]), np.full(2, 9), np.zeros((2, 3), np.float32), np.zeros(2),
       np.ones(2), np.zeros(2), Mode.TRAIN)
print('served', flush=True)
threading.Event().wait()
'''


@pytest.mark.timeout(60)
def test_a_killed_actor_leaves_no_stuck_slot_and_its_replacement_attaches(serving, wait_until):
  server, shm_server, _ = serving
  proc = subprocess.Popen([sys.executable, '-c', _ACTOR], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
  try:
    proc.stdin.write(json.dumps(shm_server.offer(proc.pid)) + '\n')
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == 'served'
    assert shm_server.attached_actors == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert wait_until(lambda: shm_server.attached_actors == 0, 10)  # freed at once
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  replacement = InferencePath(InProcessClient(server, shm_server), 0, 2, threading.Event(), 'shm')
  try:
    reply = replacement.step(*_fields([0, 1], 1.0, FIRST), Mode.TRAIN)
    np.testing.assert_array_equal(reply['action'], [2, 2])
  finally:
    replacement.close()


@pytest.mark.timeout(60)
def test_a_restarted_server_makes_actors_attach_again_without_hanging():
  client = None
  try:
    log = ActingLog()
    server = InferenceServer(_ObsPolicy(NUM_ENVS), SPEC, NUM_ENVS, None, max_batch_envs=1,
                             batch_timeout_s=0.0, acting=log)
    first = ShmServer(server, SPEC, NUM_ENVS)
    client = InProcessClient(server, first)
    path = InferencePath(client, 0, 2, threading.Event(), 'shm')
    path.step(*_fields([0, 1], 1.0, FIRST), Mode.TRAIN)
    first_generation = path.current.segment.layout.generation
    first.close()  # the central process died: its actors read end-of-file
    second = ShmServer(server, SPEC, NUM_ENVS)  # the restarted one, new generation
    client.shm_server = second
    started = time.monotonic()
    reply = path.step(*_fields([0, 1], 2.0), Mode.TRAIN)
    assert time.monotonic() - started < 5
    np.testing.assert_array_equal(reply['action'], [3, 3])
    assert path.attaches == 2
    assert path.current.segment.layout.generation == second.generation != first_generation
    path.close()
    second.close()
    server.close()
  finally:
    assert not _memfds()  # every segment of this process is unmapped and closed


@pytest.mark.timeout(60)
def test_a_stopping_actor_does_not_wait_for_a_busy_server(serving):
  server, shm_server, _ = serving
  stop = threading.Event()
  transport = ShmTransport.attach(shm_server.offer(), 0, 2, stop, 'actor')
  try:
    with pytest.raises(ServerAway):
      shm_server.close()  # the server goes away before this request is answered
      transport.step(*_fields([0, 1]), Mode.TRAIN)
  finally:
    transport.close()
  again = ShmTransport.attach  # a closed server refuses new attaches
  with pytest.raises(OSError):
    again(shm_server.offer(), 0, 2, stop, 'actor')


def test_segments_leave_nothing_in_dev_shm(serving):
  server, shm_server, _ = serving
  before = set(os.listdir('/dev/shm'))
  path = InferencePath(InProcessClient(server, shm_server), 0, 4, threading.Event(), 'shm')
  path.step(*_fields([0, 1, 2, 3], 1.0, FIRST), Mode.TRAIN)
  assert set(os.listdir('/dev/shm')) == before  # memfd: no name anywhere
  assert _memfds()  # ... but the segment is mapped here now
  path.close()
  shm_server.close()
  assert not _memfds()


def test_the_boot_id_names_this_host():
  assert shm.boot_id() == shm.boot_id() and len(shm.boot_id()) >= 32


@pytest.mark.timeout(60)
def test_a_stop_wakes_an_actor_waiting_on_a_silent_server():
  """The actor waits for a reply in a blocking recv (no timeout slices: cheaper); its
  stop event still ends the wait at once."""
  import socket  # pylint: disable=g-import-not-at-top
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  address = shm.new_address()
  listener.bind(address)
  listener.listen(1)
  segments = []

  def silent_server():  # attaches the actor, then never answers
    conn, _ = listener.accept()
    conn.recv(4096)
    segment = shm.Segment.create(SPEC, 2, 12345)
    shm.send_segment(conn, segment)
    segments.append((conn, segment))

  thread = threading.Thread(target=silent_server, daemon=True)
  thread.start()
  stop = threading.Event()
  transport = ShmTransport.attach({'address': address, 'generation': 12345}, 0, 2, stop,
                                  'actor')
  try:
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    assert transport.step(*_fields([0, 1]), Mode.TRAIN) is None
    assert 0.4 < time.monotonic() - started < 2.0
  finally:
    transport.close()
    thread.join(5)
    for conn, segment in segments:
      conn.close()
      segment.close()
    listener.close()


_BIND_AND_HOLD = '''
import os, socket, sys
from seedacme.wire import shm
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
  s.bind(shm.new_address())
except OSError as e:
  print('bind failed', e, flush=True)
  sys.exit(3)
print('bound as pid', os.getpid(), flush=True)
sys.stdin.read()
'''


@pytest.mark.timeout(60)
def test_servers_in_two_pid_namespaces_on_one_network_get_distinct_addresses():
  """Bazel's linux-sandbox runs each test in its own PID namespace on the host's network:
  two test processes, both pid 2, named their sockets alike and the second bind failed
  (CI: test_resume, EADDRINUSE). Two processes here, both pid 1 in their own PID
  namespaces, abstract sockets shared: both bind."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests.emulated_hosts import namespaces_required  # pylint: disable=g-import-not-at-top
  skip = pytest.fail if namespaces_required() else pytest.skip  # CI: fail
  if shutil.which('unshare') is None:
    skip('no `unshare` on PATH (util-linux)')
  unshare = ['unshare', '-rpf', '--mount-proc']  # the probe runs what the test runs
  probe = subprocess.run(unshare + ['true'], capture_output=True, check=False)
  if probe.returncode != 0:
    skip(f'no unprivileged PID namespaces here: {probe.stderr.decode().strip()}')
  procs = []
  try:
    for _ in range(2):
      proc = subprocess.Popen(unshare + [sys.executable, '-c', _BIND_AND_HOLD],
                              cwd=repo, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
      procs.append(proc)
      line = proc.stdout.readline().strip()
      assert line == 'bound as pid 1', line  # both pid 1: only the random part differs
  finally:
    for proc in procs:
      proc.stdin.close()
      proc.wait(timeout=20)
