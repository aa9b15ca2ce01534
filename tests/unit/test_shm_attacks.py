"""The same-host path against hostile local processes and its own faults.

Each attack is made as a local user would make it: a second, unprivileged Python
process that finds the abstract socket (it is listed in /proc/net/unix), connects,
attaches, rewrites its segment after validation, floods hellos or never reads its
wake-ups. A real `InferenceServer` and `ShmServer` serve in this process; honest
actors are `InferencePath`s here. Every wait is bounded, every process is killed and
reaped, and nothing is left in /dev/shm.
"""

import json
import logging
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from seedacme.actor.transport import InferencePath, ShmTransport
from seedacme.serving import shm_server as shm_server_lib
from seedacme.serving.policy import PolicyStep, StatelessPolicy
from seedacme.serving.server import InferenceServer
from seedacme.serving.shm_server import ShmServer
from seedacme.types import FIRST, MID, EnvSpec, InvalidActionError, Mode
from tests.unit.central_stand_ins import InProcessClient
from tests.unit.shm_server_process import ServerProcess

SPEC = EnvSpec((3,), 'float32', 5)
NUM_ENVS = 8


class _RecordingPolicy(StatelessPolicy):
  """Action = round(observation[0]) + 1; records what each batch carried; raises
  `fail` (once) when set."""

  def __init__(self, num_envs):
    super().__init__(num_envs)
    self.seen = []
    self.fail = None

  def act(self, observation, eval_mask, env_ids):
    self.seen.append((np.array(env_ids), np.array(observation)))
    if self.fail is not None:
      error, self.fail = self.fail, None
      raise error
    return PolicyStep(np.rint(observation[:, 0]).astype(np.int32) + 1, {}, ())


class _Sink:
  """A trajectory sink whose `add` raises `fail` (once) when set."""

  def __init__(self):
    self.fail = None
    self.rewards = []

  def add(self, env_ids, step):
    self.rewards.append(np.array(step['reward']))
    if self.fail is not None:
      error, self.fail = self.fail, None
      raise error

  def reset(self, env_ids):
    pass

  def stats(self):
    return {}

  def close(self):
    pass


@pytest.fixture(name='serving')
def _serving():
  before = set(os.listdir('/dev/shm'))
  policy, sink = _RecordingPolicy(NUM_ENVS), _Sink()
  server = InferenceServer(policy, SPEC, NUM_ENVS, sink, max_batch_envs=1,
                           batch_timeout_s=0.0)
  shm_server = ShmServer(server, SPEC, NUM_ENVS)
  yield server, shm_server, policy, sink
  shm_server.close()
  server.close()
  assert set(os.listdir('/dev/shm')) == before


def _offer_for(shm_server, pid):
  return shm_server.offer(pid)


def _fields(ids, value=1.0, step_type=MID):
  k = len(ids)
  return (np.asarray(ids), np.full(k, 7), np.full((k, 3), value, np.float32), np.zeros(k),
          np.ones(k), np.full(k, step_type))


def _step_bounded(path, ids, value, timeout_s, step_type=MID):
  """`path.step` that gives up after `timeout_s` (its stop event ends a blocked wait)."""
  timer = threading.Timer(timeout_s, path._stop.set)  # pylint: disable=protected-access
  timer.start()
  try:
    return path.step(*_fields(ids, value, step_type), Mode.TRAIN)
  finally:
    timer.cancel()


class _Process:
  """A second Python process running `script`; lines in and out, each wait bounded;
  killed and reaped at the end."""

  def __init__(self, script, *args):
    self.proc = subprocess.Popen([sys.executable, '-c', script, *map(str, args)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.pid = self.proc.pid

  def send(self, value):
    self.proc.stdin.write(json.dumps(value) + '\n')
    self.proc.stdin.flush()

  def line(self, timeout_s=20.0):
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
    if not ready:
      return '<no answer>'
    return self.proc.stdout.readline().strip()

  def close(self):
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(10)
    self.proc.stdin.close()
    self.proc.stdout.close()


@pytest.fixture(name='processes')
def _processes():
  started = []
  yield lambda script, *args: started.append(_Process(script, *args)) or started[-1]
  for p in started:
    p.close()


# ---- who may attach ----------------------------------------------------------------

_STRANGER = r'''
import json, socket, sys
address = '\0' + sys.argv[1]
offer = json.loads(sys.stdin.readline())  # what the stranger knows: {} or a leaked offer
try:  # the generation, where the name gives it away
  generation = int(address.rsplit('-', 1)[1], 16)
except ValueError:
  generation = 0
generation = offer.get('generation', generation)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.settimeout(10)
conn.connect(address)
try:
  try:
    conn.sendall(json.dumps({'first_env_id': 0, 'num_envs': 8, 'generation': generation,
                             'ticket': offer.get('ticket', '')}).encode() + b'\n')
  except BrokenPipeError:
    pass  # refused before it said hello; the reason is there to read
  data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
  message = json.loads(data.decode()) if data else {'error': '<closed>'}
except OSError as e:
  fds, message = [], {'error': f'<{type(e).__name__}>'}
print('attached' if fds else 'refused: ' + message.get('error', ''), flush=True)
sys.stdin.readline()  # holds whatever it got until told to go
'''


@pytest.mark.timeout(60)
def test_a_stranger_that_finds_the_socket_cannot_take_env_slots(serving, processes):
  server, shm_server, _, _ = serving
  name = shm_server.address[1:]
  with open('/proc/net/unix') as f:
    assert '@' + name in f.read()  # anyone on the host can read the name
  stranger = processes(_STRANGER, name)
  stranger.send({})
  answer = stranger.line()
  assert answer.startswith('refused: no shared-memory offer is outstanding for pid '
                           f'{stranger.pid}'), answer
  # The run's own actor still gets all 8 envs through shared memory.
  path = InferencePath(InProcessClient(server, shm_server), 0, 8, threading.Event(), 'shm')
  try:
    reply = _step_bounded(path, list(range(8)), 2.0, 10, FIRST)
    assert reply is not None and path.name == 'shm'
    np.testing.assert_array_equal(reply['action'], [3] * 8)
  finally:
    path.close()


@pytest.mark.timeout(60)
def test_a_leaked_offer_admits_no_other_process(serving, processes):
  server, shm_server, _, _ = serving
  offer = shm_server.offer()  # made for this process
  thief = processes(_STRANGER, shm_server.address[1:])
  thief.send(offer)  # everything the actor knows: address, generation, its ticket
  answer = thief.line()
  assert answer.startswith(f'refused: no shared-memory offer is outstanding for pid '
                           f'{thief.pid}'), answer
  transport = ShmTransport.attach(offer, 0, 8, threading.Event(), 'actor')  # still good
  transport.close()


def test_the_socket_name_carries_no_secret(serving):
  _, shm_server, _, _ = serving
  offer = shm_server.offer()
  name = shm_server.address
  assert f"{offer['generation']:x}" not in name and str(offer['generation']) not in name
  assert offer.get('ticket') and offer['ticket'] not in name


@pytest.mark.timeout(60)
def test_a_peer_of_another_uid_is_refused(serving):
  _, shm_server, _, _ = serving
  shm_server._uid = os.geteuid() + 1  # pylint: disable=protected-access
  with pytest.raises(ConnectionRefusedError, match=r'uid \d+ may not attach'):
    ShmTransport.attach(shm_server.offer(), 0, 2, threading.Event(), 'actor')
  assert shm_server.attached_actors == 0


# ---- requests rewritten after validation ---------------------------------------------

_REWRITER = r'''
import json, select, sys, threading, numpy as np
from seedacme.actor.transport import ShmTransport
from seedacme.types import Mode
from seedacme.wire import shm
offer = json.loads(sys.stdin.readline())
t = ShmTransport.attach(offer, 0, 2, threading.Event(), 'rewriter')
s = t.segment
s.write_request(np.array([0, 1]), np.full(2, 9), np.ones((2, 3), np.float32), np.zeros(2),
                np.ones(2), np.ones(2), Mode.TRAIN)
t._conn.sendall(shm.REQUEST)
sys.stdin.readline()  # the server validated the request: now rewrite the segment
how = sys.argv[1]
if how == 'env id out of range':
  s.ids[0, :2] = [10**9, 1]
elif how == 'env id of another actor':
  s.ids[0, :2] = [0, 5]
elif how == 'NaN observation':
  s.observation[:2] = np.nan
elif how == 'huge reward':
  s.transition[0, :2] = 3e38
print('rewritten', flush=True)
ready, _, _ = select.select([t._conn], [], [], 10)
if not ready:
  print('no reply', flush=True)
elif not t._conn.recv(1):
  print('closed', flush=True)  # the server detached it (or stopped serving)
else:
  print(json.dumps({k: np.asarray(v).tolist() for k, v in s.read_reply().items()}),
        flush=True)
sys.stdin.readline()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize('how', ['env id out of range', 'env id of another actor',
                                 'NaN observation', 'huge reward'])
def test_a_request_rewritten_after_validation_is_served_as_validated(serving, processes,
                                                                     how):
  server, shm_server, policy, sink = serving
  rewriter = processes(_REWRITER, how)
  process = server._batcher._process_fn  # pylint: disable=protected-access
  answers, struck = [], threading.Event()

  def after_validation(groups):  # the batch was validated; the rewriter strikes now
    if not answers:
      rewriter.send('go')
      answers.append(rewriter.line())
      struck.set()
    return process(groups)

  server._batcher._process_fn = after_validation  # pylint: disable=protected-access
  rewriter.send(_offer_for(shm_server, rewriter.pid))
  assert struck.wait(20) and answers == ['rewritten'], answers
  reply = rewriter.line()
  assert reply.startswith('{'), reply  # answered, not detached nor left waiting
  assert json.loads(reply) == {'action': [2, 2]}, reply  # served what was validated
  (env_ids, observation), = policy.seen
  np.testing.assert_array_equal(env_ids, [0, 1])
  np.testing.assert_array_equal(observation, np.ones((2, 3), np.float32))
  np.testing.assert_array_equal(sink.rewards[0], [0, 0])
  # ... and serving goes on for everyone.
  path = InferencePath(InProcessClient(server, shm_server), 4, 4, threading.Event(), 'shm')
  try:
    reply = _step_bounded(path, [4, 5, 6, 7], 1.0, 10, FIRST)
    assert reply is not None
    np.testing.assert_array_equal(reply['action'], [2] * 4)
  finally:
    path.close()


# ---- one failing batch ---------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize('where', ['policy', 'trajectory sink'])
def test_a_failing_batch_fails_its_callers_by_name_and_serving_goes_on(serving, caplog,
                                                                       where):
  server, shm_server, policy, sink = serving
  path = InferencePath(InProcessClient(server, shm_server), 0, 4, threading.Event(), 'shm')
  other = InferencePath(InProcessClient(server, shm_server), 4, 4, threading.Event(), 'shm')
  try:
    assert _step_bounded(path, [0, 1, 2, 3], 1.0, 10, FIRST) is not None
    (policy if where == 'policy' else sink).fail = MemoryError('simulated out of memory')
    with caplog.at_level(logging.WARNING):
      reply = _step_bounded(path, [0, 1, 2, 3], 2.0, 10)  # failed once, then retried
    assert reply is not None and path.name == 'shm'
    np.testing.assert_array_equal(reply['action'], [3] * 4)
    assert shm_server.failed_batches == 1
    assert 'the inference batch failed on the server: MemoryError: simulated out of ' \
        'memory' in caplog.text
    reply = _step_bounded(other, [4, 5, 6, 7], 0.0, 10, FIRST)
    assert reply is not None
    np.testing.assert_array_equal(reply['action'], [1] * 4)
    assert path.attaches == 1 and shm_server.attached_actors == 2  # nobody re-attached
  finally:
    path.close()
    other.close()


@pytest.mark.timeout(60)
def test_actions_no_env_may_take_stop_the_run_as_on_courier(serving):
  """The policy's own fault: every caller is told the server is shutting down and
  `policy_error` names it (the central node stops the run as diverged); the loop
  still answers."""
  server, shm_server, policy, _ = serving
  path = InferencePath(InProcessClient(server, shm_server), 0, 2, threading.Event(), 'shm')
  try:
    policy.fail = InvalidActionError('action 7 outside [0, 5)')
    reply = _step_bounded(path, [0, 1], 1.0, 10, FIRST)
    assert 'shutting_down' in reply and 'action 7 outside' in reply['shutting_down']
    assert 'action 7 outside' in server.policy_error
    assert 'shutting_down' in _step_bounded(path, [0, 1], 1.0, 10)
  finally:
    path.close()


@pytest.mark.timeout(60)
def test_actions_no_env_may_take_in_a_merged_batch_reach_every_caller():
  """Two actors ready together are served as one merged request: its refusal reaches
  both as `shutting_down` (it raised KeyError in the loop before)."""
  policy = _RecordingPolicy(NUM_ENVS)
  server = InferenceServer(policy, SPEC, NUM_ENVS, None, max_batch_envs=8,
                           batch_timeout_s=1.0)  # the loop waits for both
  shm_server = ShmServer(server, SPEC, NUM_ENVS)
  paths = {first: InferencePath(InProcessClient(server, shm_server), first, 4, threading.Event(),
                                 'shm') for first in (0, 4)}
  try:
    policy.fail = InvalidActionError('action 7 outside [0, 5)')
    with futures.ThreadPoolExecutor(2) as pool:
      replies = list(pool.map(
          lambda first: _step_bounded(paths[first], list(range(first, first + 4)), 1.0, 10,
                                      FIRST), paths))
    assert len(policy.seen) == 1 and len(policy.seen[0][0]) == 8  # one merged batch
    for reply in replies:
      assert reply is not None and 'action 7 outside' in reply['shutting_down'], reply
  finally:
    for p in paths.values():
      p.close()
    shm_server.close()
    server.close()


# ---- an actor that never reads its wake-ups --------------------------------------------

_DEAF = r'''
import json, sys, threading, time, numpy as np
from seedacme.actor.transport import ShmTransport
from seedacme.types import Mode
from seedacme.wire import shm
offer = json.loads(sys.stdin.readline())
t = ShmTransport.attach(offer, 0, 2, threading.Event(), 'deaf actor')
s = t.segment
served, outcome = 0, 'limit'
while served < 200000:
  s.write_request(np.array([0, 1]), np.full(2, 9), np.ones((2, 3), np.float32),
                  np.zeros(2), np.ones(2), np.ones(2), Mode.TRAIN)
  s.header[shm.STATUS] = 99
  try:
    t._conn.sendall(shm.REQUEST)
  except OSError as e:
    outcome = 'detached'
    break
  deadline = time.monotonic() + 3
  while s.header[shm.STATUS] == 99 and time.monotonic() < deadline:
    pass  # watches the segment; never reads the socket
  if s.header[shm.STATUS] == 99:
    outcome = 'stalled'
    break
  served += 1
print(outcome, served, flush=True)
sys.stdin.readline()
'''


@pytest.mark.timeout(90)
def test_an_actor_that_never_reads_its_wake_ups_is_detached_and_others_are_served(
    serving, processes, caplog):
  server, shm_server, _, _ = serving
  deaf = processes(_DEAF)
  with caplog.at_level(logging.WARNING):
    deaf.send(_offer_for(shm_server, deaf.pid))
    outcome = deaf.line(60)
  kind, served = outcome.split()
  assert kind in ('detached', 'stalled') and int(served) > 100, outcome
  assert 'stopped reading its wake-ups' in caplog.text
  # The loop never blocked on it: everyone else is served at once.
  path = InferencePath(InProcessClient(server, shm_server), 4, 4, threading.Event(), 'shm')
  try:
    started = time.monotonic()
    for value in range(20):
      reply = _step_bounded(path, [4, 5, 6, 7], float(value), 5, MID if value else FIRST)
      assert reply is not None, 'the serving loop is blocked'
    assert time.monotonic() - started < 5
  finally:
    path.close()


# ---- floods of connections and hellos -----------------------------------------------

_FLOOD = r'''
import json, select, socket, sys, time
address, count, trickle = '\0' + sys.argv[1], int(sys.argv[2]), sys.argv[3] == 'trickle'
sys.stdin.readline()
conns = []
for _ in range(count):
  c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  c.settimeout(2)
  try:
    c.connect(address)
  except OSError:
    c.close()
    continue
  c.setblocking(False)
  conns.append(c)
print('connected', len(conns), flush=True)
started, closed = time.monotonic(), {}
while time.monotonic() - started < float(sys.argv[4]):
  for i, c in enumerate(conns):
    if i in closed:
      continue
    try:
      if trickle:
        c.send(b' ')  # one more byte of a hello that never ends, every 0.3 s
      if select.select([c], [], [], 0)[0]:
        c.recv(4096)  # end-of-file, or a refusal before it
        closed[i] = time.monotonic() - started
    except OSError:
      closed[i] = time.monotonic() - started
  time.sleep(0.3)
print(json.dumps(sorted(closed.values())), flush=True)
sys.stdin.readline()
'''


def _attach_threads():
  return sum(t.name == 'shm-attach' for t in threading.enumerate())


@pytest.mark.timeout(60)
def test_a_connection_flood_from_a_stranger_costs_no_threads(serving, processes):
  server, shm_server, _, _ = serving
  flood = processes(_FLOOD, shm_server.address[1:], 300, 'trickle', 1.5)
  flood.send('go')
  assert flood.line().startswith('connected')
  most = 0
  path = InferencePath(InProcessClient(server, shm_server), 0, 8, threading.Event(), 'shm')
  try:
    reply = _step_bounded(path, list(range(8)), 1.0, 10, FIRST)  # attaches meanwhile
    assert reply is not None and path.name == 'shm'
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
      most = max(most, _attach_threads())
      time.sleep(0.02)
  finally:
    path.close()
  closed = json.loads(flood.line())
  assert len(closed) >= 250 and max(closed) < 1.5, closed  # refused at once
  assert most <= shm_server_lib.MAX_HELLOS


@pytest.mark.timeout(60)
def test_a_hello_has_one_deadline_however_it_trickles(serving, processes):
  _, shm_server, _, _ = serving
  flood = processes(_FLOOD, shm_server.address[1:], 1, 'trickle', 3.5)
  _offer_for(shm_server, flood.pid)  # a process the run knows, misbehaving
  flood.send('go')
  assert flood.line() == 'connected 1'
  closed = json.loads(flood.line())
  assert len(closed) == 1 and closed[0] < shm_server_lib.HELLO_DEADLINE_S + 1.0, closed


@pytest.mark.timeout(60)
def test_hellos_read_at_once_are_capped(serving, processes, monkeypatch):
  server, shm_server, _, _ = serving
  monkeypatch.setattr(shm_server_lib, 'MAX_HELLOS', 2, raising=False)
  flood = processes(_FLOOD, shm_server.address[1:], 6, 'silent', 1.5)
  for _ in range(6):
    _offer_for(shm_server, flood.pid)
  flood.send('go')
  assert flood.line() == 'connected 6'
  most, deadline = 0, time.monotonic() + 1.5
  while time.monotonic() < deadline:
    most = max(most, _attach_threads())
    time.sleep(0.01)
  assert most <= 2
  flood.line()
  flood.proc.kill()  # its connections close; serving goes on
  path = InferencePath(InProcessClient(server, shm_server), 0, 2, threading.Event(), 'shm')
  try:
    assert _step_bounded(path, [0, 1], 1.0, 15, FIRST) is not None
  finally:
    path.close()


@pytest.mark.timeout(60)
def test_accept_survives_running_out_of_file_descriptors(serving, caplog):
  """EMFILE: a blocked `accept` holds the descriptor number of its next connection,
  so one connection is let in first; the `accept` after it finds none left."""
  _, shm_server, _, _ = serving
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  shm_server.offer()  # so that the first connection is admitted and waits in its hello
  fillers = []
  with caplog.at_level(logging.WARNING):
    try:
      top = max(int(fd) for fd in os.listdir('/proc/self/fd'))
      resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
      while True:  # fill every free descriptor number below the limit
        try:
          fillers.append(os.open('/dev/null', os.O_RDONLY))
        except OSError:
          break
      client.connect(shm_server.address)
      time.sleep(0.3)
    finally:
      resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
      for fd in fillers:
        os.close(fd)
      client.close()
    assert 'Too many open files' in caplog.text
  started = time.monotonic()  # the accept loop goes on: an actor attaches at once
  transport = ShmTransport.attach(shm_server.offer(), 0, 2, threading.Event(), 'actor')
  transport.close()
  assert time.monotonic() - started < 3


def test_offers_are_bound_to_their_process_void_none_and_expire(monkeypatch, processes):
  offers = shm_server_lib.Offers()
  other = processes('import sys; sys.stdin.readline()')
  mine = offers.issue(os.getpid())
  for _ in range(100):  # any number of offers, for this pid or another, voids none
    offers.issue(os.getpid())
    offers.issue(other.pid)
  assert offers.admits(os.getpid()) and offers.admits(other.pid)
  assert offers.redeem(os.getpid(), mine) and offers.redeem(os.getpid(), mine)
  assert not offers.redeem(other.pid, mine)  # made for another process
  expires, mac = mine.split('.')
  assert not offers.redeem(os.getpid(), f'{int(expires) + 1}.{mac}')  # forged expiry
  assert not offers.redeem(os.getpid(), '') and not offers.redeem(os.getpid(), 'x.y')
  theirs = offers.issue(other.pid)
  other.close()  # gone: its pid may be anyone's next, its ticket is nobody's
  assert not offers.redeem(other.pid, theirs)
  with pytest.raises(shm_server_lib.OfferRefusedError, match='no process of uid'):
    offers.issue(other.pid)
  with pytest.raises(shm_server_lib.OfferRefusedError, match='no process of uid'):
    shm_server_lib.Offers(uid=os.geteuid() + 1).issue(os.getpid())  # another user's
  monkeypatch.setattr(shm_server_lib, 'OFFER_TTL_S', 0.01)
  offers = shm_server_lib.Offers()
  ticket = offers.issue(os.getpid())
  time.sleep(0.02)
  assert not offers.admits(os.getpid()) and not offers.redeem(os.getpid(), ticket)


def test_a_full_offer_table_refuses_new_processes_and_keeps_its_entries(monkeypatch,
                                                                        processes):
  monkeypatch.setattr(shm_server_lib, 'MAX_OFFERS', 1)
  offers = shm_server_lib.Offers()
  mine = offers.issue(os.getpid())
  other = processes('import sys; sys.stdin.readline()')
  with pytest.raises(shm_server_lib.OfferRefusedError, match='1 live processes hold'):
    offers.issue(other.pid)
  assert offers.admits(os.getpid()) and offers.redeem(os.getpid(), mine)


@pytest.mark.timeout(60)
def test_an_actor_refused_by_name_stops_with_the_reason_not_for_ever(serving):
  """transport='shm' and every attach refused (here: the server's uid is another):
  it asked again for ever (issue 47); it stops after a few, naming the refusal."""
  server, shm_server, _, _ = serving
  shm_server._uid = os.geteuid() + 1  # pylint: disable=protected-access
  path = InferencePath(InProcessClient(server, shm_server), 0, 2, threading.Event(), 'shm')
  started = time.monotonic()
  try:
    with pytest.raises(RuntimeError, match=r'attaching was refused 5 times in a row; '
                       r'last: uid \d+ may not attach'):
      _step_bounded(path, [0, 1], 1.0, 30, FIRST)
  finally:
    path.close()
  assert time.monotonic() - started < 15


@pytest.mark.timeout(60)
def test_an_offer_for_a_process_elsewhere_says_why_and_the_actor_stops(serving):
  """A pid the server cannot see as a process of its uid (another PID namespace, a
  process gone): the offer says why, and a transport='shm' actor stops with it."""
  server, shm_server, _, _ = serving
  gone = subprocess.Popen(['true'])
  gone.wait()
  offer = shm_server.offer(gone.pid)
  assert not offer['ticket'] and 'no process of uid' in offer['refused'], offer
  client = InProcessClient(server, shm_server)
  client.shm_offer = lambda pid=None: client._done(shm_server.offer(gone.pid))
  path = InferencePath(client, 0, 2, threading.Event(), 'shm')
  try:
    with pytest.raises(RuntimeError, match='offers no shared memory to this process: '
                       f'pid {gone.pid} is no process of uid'):
      _step_bounded(path, [0, 1], 1.0, 10, FIRST)
  finally:
    path.close()


# ---- a server in a process of its own (an attack that works kills it) -----------------

def _served_here(server_process, first=0, num=2, value=1.0):
  """Attaches this process as an honest actor to `server_process`; one request's reply."""
  transport = ShmTransport.attach(server_process.offer(os.getpid()), first, num,
                                  threading.Event(), 'honest actor')
  try:
    return transport.step(*_fields(list(range(first, first + num)), value, FIRST),
                          Mode.TRAIN)
  finally:
    transport.close()


_SHRINKER = r'''
import errno, json, os, socket, sys
offer = json.loads(sys.stdin.readline())
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.settimeout(10)
conn.connect(offer['address'])
conn.sendall(json.dumps({'first_env_id': 0, 'num_envs': 2, 'generation': offer['generation'],
                         'ticket': offer['ticket']}).encode() + b'\n')
data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
outcomes = []
for how in ('grow', 'ftruncate 8', 'reopen and ftruncate 0', 'ftruncate 0'):
  fd = os.open(f'/proc/self/fd/{fds[0]}', os.O_RDWR) if how.startswith('reopen') else fds[0]
  try:
    os.ftruncate(fd, 1 << 30 if how == 'grow' else int(how.split()[-1]))
    outcomes.append(how + ': done')
  except OSError as e:
    outcomes.append(how + ': ' + errno.errorcode[e.errno])
try:
  conn.sendall(b'q')  # the server reads its header now
  outcomes.append('woke: ' + repr(conn.recv(1)))
except OSError as e:
  outcomes.append('woke: ' + type(e).__name__)
print(json.dumps(outcomes), flush=True)
sys.stdin.readline()
'''


@pytest.mark.timeout(90)
def test_an_attached_actor_cannot_shrink_its_segment_under_the_server(processes):
  """It could (issue 47): the memfd was made without MFD_ALLOW_SEALING, and after the
  actor's `ftruncate(fd, 0)` the server's next header read killed it with SIGBUS."""
  server = ServerProcess()
  try:
    shrinker = processes(_SHRINKER)
    shrinker.send(server.offer(shrinker.pid))
    outcomes = json.loads(shrinker.line())
    assert outcomes[:4] == ['grow: EPERM', 'ftruncate 8: EPERM',
                            'reopen and ftruncate 0: EPERM', 'ftruncate 0: EPERM'], outcomes
    assert server.alive(), outcomes
    assert outcomes[4] == "woke: b'a'", outcomes  # its request was answered
    np.testing.assert_array_equal(_served_here(server, 4, 2)['action'], [2, 2])
  finally:
    server.close()


_SENDS_A_MEMFD = r'''
import json, os, socket, sys
offer = json.loads(sys.stdin.readline())
fd = os.memfd_create('hostile')  # unsealed: it could shrink it under whoever maps it
os.ftruncate(fd, 1 << 20)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.settimeout(10)
conn.connect(offer['address'])
socket.send_fds(conn, [json.dumps({'first_env_id': 0, 'num_envs': 2,
                                   'generation': offer['generation'],
                                   'ticket': offer['ticket']}).encode() + b'\n'], [fd] * 3)
os.ftruncate(fd, 0)
data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
print(json.dumps({'fds': len(fds), 'reply': data.decode()}), flush=True)
sys.stdin.readline()
'''


@pytest.mark.timeout(90)
def test_a_memfd_sent_to_the_server_is_refused_and_closed(processes):
  server = ServerProcess()
  try:
    _served_here(server)  # the server's own threads and descriptors, settled
    fds = server.settled_fds()
    hostile = processes(_SENDS_A_MEMFD)
    hostile.send(server.offer(hostile.pid))
    answer = json.loads(hostile.line())
    assert answer['fds'] == 0 and 'carries file descriptors; none are expected' in \
        answer['reply'], answer
    assert server.alive() and server.settled_fds(expect=fds) == fds  # none of its three kept
    np.testing.assert_array_equal(_served_here(server)['action'], [2, 2])
  finally:
    server.close()


_HOSTILE_SERVER = r'''
import json, os, socket, sys
from seedacme.wire import shm
how = sys.argv[1]
layout = shm.Layout(2, (3,), 'float32', 7)
size = layout.offsets()['size']
fd = os.memfd_create('hostile', os.MFD_ALLOW_SEALING)
os.ftruncate(fd, size if how != 'too small' else size // 2)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind('\0' + sys.argv[2])
listener.listen(1)
print('ready', flush=True)
conn, _ = listener.accept()
conn.recv(4096)
if how == 'too small':
  import fcntl
  fcntl.fcntl(fd, fcntl.F_ADD_SEALS, shm.SEALS)
socket.send_fds(conn, [layout.to_json()], [fd])
if how == 'unsealed':
  os.ftruncate(fd, 0)  # what the actor would read past: SIGBUS
sys.stdin.readline()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize('how,why', [('unsealed', 'not sealed against resizing'),
                                     ('too small', r'holds \d+ bytes, its layout \d+')])
def test_an_actor_maps_no_segment_its_sender_could_shrink(processes, how, why):
  """Whichever side made the memfd, the other checks it: a hostile server's unsealed
  or short segment is refused before it is mapped, by name."""
  name = f'seedacme-test-hostile-{os.getpid()}-{os.urandom(4).hex()}'
  hostile = processes(_HOSTILE_SERVER, how, name)
  assert hostile.line() == 'ready'
  offer = {'address': '\0' + name, 'generation': 7, 'ticket': 'x'}
  with pytest.raises(ConnectionRefusedError, match=why):
    ShmTransport.attach(offer, 0, 2, threading.Event(), 'actor')
  assert not [fd for fd in os.listdir('/proc/self/fd')
              if 'hostile' in os.path.realpath(f'/proc/self/fd/{fd}')]  # closed


_VICTIM = r'''
import json, sys, threading, courier
from seedacme.actor.transport import ShmTransport
import os
client = courier.Client(sys.argv[1])
offer = client.shm_offer(os.getpid())  # over Courier, as an actor asks
print('offered', flush=True)
sys.stdin.readline()  # the evictor has made its calls
try:
  t = ShmTransport.attach(offer, 0, 2, threading.Event(), 'victim')
  print('attached', flush=True)
  t.close()
except OSError as e:
  print('refused:', e, flush=True)
sys.stdin.readline()
'''

_EVICTOR = r'''
import sys, courier
client = courier.Client(sys.argv[1])
victim = int(sys.argv[2])
calls = [client.futures.shm_offer(victim) for _ in range(8)]  # eight for its pid
for chunk in range(0, 4096, 512):  # and 4,096 for any pids
  calls += [client.futures.shm_offer(pid) for pid in range(chunk + 1, chunk + 513)]
  for call in calls:
    try:
      call.result(timeout=60)
    except Exception:
      pass
  calls = []
print('done', flush=True)
sys.stdin.readline()
'''


@pytest.mark.timeout(180)
def test_courier_calls_for_other_pids_void_no_ticket(processes):
  """Any Courier caller could evict another actor's ticket (issue 47): eight offers
  for the victim's pid, or 4,096 for any, left it refused."""
  import portpicker  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  server = ServerProcess(port)
  try:
    address = f'localhost:{port}'
    victim = processes(_VICTIM, address)
    assert victim.line(60) == 'offered'
    evictor = processes(_EVICTOR, address, victim.pid)
    assert evictor.line(120) == 'done'
    victim.send('go')
    assert victim.line() == 'attached'
    assert server.alive()
  finally:
    server.close()
