"""A seeded fuzzer against the same-host socket of a live server (issue 47, item 3).

The server (`tests.unit.shm_server_process`) runs in a process of its own, so that an
input that kills it fails this test instead of killing pytest. This process, holding an
offer, connects thousands of times with what a broken or hostile local peer sends:

* hellos: garbage, truncated (closed at once, or left open to the deadline),
  oversized, unterminated, wrong types and ranges, wrong or forged tickets, stale
  generations, file descriptors (one to too many), no hello at all;
* frames, once attached: headers with any size and mode, env ids out of range or
  another actor's, NaN and huge values, the whole segment random, a burst of wake-ups,
  garbage on the socket, a request then an early close; and requests with one field
  wrong (NaN or inf observations, rewards and discounts, a reward past the env's bound,
  a step type that is none), whose refusal must name that field (issue 62). A segment's
  dtypes and shapes are the server's own, and a header's size is clamped to it: wrong
  dtypes, shapes and giant batches are the Courier fuzzer's (test_courier_fuzz.py).

It asserts the server process stays up, serves a well-formed actor afterwards, and its
descriptors, threads and RSS stay flat (measured after a warm-up; RSS within
`RSS_SLACK_KB`). The generator is Python's `random` with a fixed seed: a failure
reproduces. Its size: `SEEDACME_SHM_FUZZ_CASES` (default 5,000 connections, ~10 s
on a loaded 2-core machine); `SEEDACME_SHM_FUZZ_SEED` for another seed, e.g.

    SEEDACME_SHM_FUZZ_CASES=50000 python -m pytest tests/unit/test_shm_fuzz.py -s

prints the counts by kind, time and the server's RSS at the end.
"""

import collections
import json
import os
import random
import select
import socket
import threading
import time

import numpy as np
import pytest

from seedacme.actor.transport import ShmTransport
from seedacme.types import FIRST, Mode
from seedacme.wire import shm
from tests.unit.shm_server_process import NUM_ENVS, ServerProcess

CASES = int(os.environ.get('SEEDACME_SHM_FUZZ_CASES', '5000'))
SEED = int(os.environ.get('SEEDACME_SHM_FUZZ_SEED', '47'))
RSS_SLACK_KB = 16 * 1024  # allocator noise; a leak per connection grows past it
_REPLY_WAIT_S = 3.0


def _hello(first=0, num=2, generation=0, ticket=''):
  return json.dumps({'first_env_id': first, 'num_envs': num, 'generation': generation,
                     'ticket': ticket}).encode() + b'\n'


def _odd_value(rng):
  return rng.choice([None, -1, 0, 2**63, -2**63, 1e308, float('nan'), 'x' * rng.randint(0, 50),
                     [], {}, [1, 2], True, '0', 1.5])


class _Fuzzer:
  """One connection per `case`, its kind drawn from `rng`; counts what was sent."""

  def __init__(self, rng, offer):
    self.rng, self.offer = rng, offer
    self.counts = collections.Counter()
    self.open_conns = []  # silent or truncated hellos left open to the deadline
    self.misnamed = []  # (kind, reply) of one-field-wrong requests not refused by name

  def _connect(self):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(_REPLY_WAIT_S)
    conn.connect(self.offer['address'])
    return conn

  def _answer(self, conn):
    """Whatever the server answers (a refusal, or a segment's layout); its fds closed."""
    try:
      data, fds, _, _ = socket.recv_fds(conn, 65536, 4)
    except OSError:
      return b'', []
    return data, fds

  def _valid(self, **changes):
    fields = dict(first=self.rng.randrange(NUM_ENVS - 3), num=self.rng.randint(1, 3),
                  generation=self.offer['generation'], ticket=self.offer['ticket'])
    fields.update(changes)
    return _hello(**fields)

  def hello(self):
    rng = self.rng
    kind = rng.choice(['garbage', 'truncated', 'truncated open', 'oversized',
                       'unterminated', 'odd fields', 'wrong ticket', 'forged ticket',
                       'stale generation', 'fds', 'too many fds', 'nothing', 'env range',
                       'utf8 junk'])
    self.counts['hello: ' + kind] += 1
    conn = self._connect()
    try:
      if kind == 'garbage':
        conn.sendall(rng.randbytes(rng.randint(1, 3000)) + rng.choice([b'', b'\n']))
      elif kind in ('truncated', 'truncated open'):
        data = self._valid()
        conn.sendall(data[:rng.randrange(1, len(data) - 1)])
        if kind == 'truncated open' and len(self.open_conns) < 8:
          self.open_conns.append(conn)  # the server's deadline closes it
          conn = None
          return
      elif kind == 'oversized':
        conn.sendall(b'{"ticket": "' + b'a' * rng.randint(4000, 20000) + b'"}\n')
      elif kind == 'unterminated':
        conn.sendall(self._valid()[:-1])
        conn.shutdown(socket.SHUT_WR)
      elif kind == 'odd fields':
        fields = json.loads(self._valid())
        for name in rng.sample(sorted(fields), rng.randint(1, 4)):
          if rng.random() < 0.3:
            del fields[name]
          else:
            fields[name] = _odd_value(rng)
        conn.sendall(json.dumps(fields).encode() + b'\n')
      elif kind == 'wrong ticket':
        conn.sendall(self._valid(ticket=rng.choice(['', 'x', rng.randbytes(16).hex(),
                                                    '1.' + rng.randbytes(32).hex()])))
      elif kind == 'forged ticket':  # a later expiry, or one hex digit changed
        expires, mac = self.offer['ticket'].split('.')
        if rng.random() < 0.5:
          ticket = f'{int(expires) + rng.randint(1, 10**9)}.{mac}'
        else:
          i = rng.randrange(len(mac))
          ticket = f'{expires}.{mac[:i]}{"0" if mac[i] != "0" else "1"}{mac[i + 1:]}'
        conn.sendall(self._valid(ticket=ticket))
      elif kind == 'stale generation':
        conn.sendall(self._valid(generation=self.offer['generation'] ^ rng.randint(1, 99)))
      elif kind in ('fds', 'too many fds'):
        fds = [os.memfd_create('fuzz'), os.open('/dev/null', os.O_RDONLY)]
        if kind == 'too many fds':
          fds = fds * rng.randint(3, 60)
        try:
          socket.send_fds(conn, [self._valid()], fds[:rng.randint(1, len(fds))])
        finally:
          for fd in set(fds):
            os.close(fd)
      elif kind == 'nothing':
        pass  # closed at once
      elif kind == 'env range':
        conn.sendall(self._valid(first=rng.choice([-1, NUM_ENVS, 2**40, NUM_ENVS - 1]),
                                 num=rng.choice([0, -5, 2, 5000, 2**40])))
      elif kind == 'utf8 junk':
        conn.sendall('{"first_env_id": "\udcff\u0000"}\n'.encode('utf-8', 'surrogatepass'))
      if kind != 'nothing' and rng.random() < 0.8:
        if kind != 'unterminated':  # nothing more comes: not a wait to the deadline
          conn.shutdown(socket.SHUT_WR)
        data, fds = self._answer(conn)
        for fd in fds:
          os.close(fd)
        self.counts['answered' if data else 'closed unanswered'] += 1
    except OSError:
      self.counts['reset'] += 1
    finally:
      if conn is not None:
        conn.close()
      if len(self.open_conns) >= 8 or (self.open_conns and rng.random() < 0.01):
        for c in self.open_conns:
          c.close()
        self.open_conns = []

  def frames(self):
    """Attaches with the offer, then sends hostile frames until detached or done."""
    rng = self.rng
    first, num = rng.randrange(NUM_ENVS - 4), rng.randint(1, 4)
    conn = self._connect()
    try:
      conn.sendall(_hello(first, num, self.offer['generation'], self.offer['ticket']))
      segment = shm.receive_segment(conn)
    except OSError:  # an overlapping actor not detached yet, ...
      self.counts['attach refused'] += 1
      conn.close()
      return
    self.counts['attached'] += 1
    raw = np.frombuffer(segment._map, np.uint8)  # pylint: disable=protected-access
    clean = True  # no wake-up sent that was not answered one for one
    try:
      for _ in range(rng.randint(1, 12)):
        kind = rng.choice(['valid', 'header', 'ids', 'values', 'random segment', 'burst',
                           'garbage bytes', 'close early'] + list(_ONE_FIELD_WRONG))
        self.counts['frame: ' + kind] += 1
        k = rng.randint(1, num)
        segment.write_request(np.arange(first, first + k), np.full(k, 1),
                              np.ones((k, 3), np.float32), np.zeros(k), np.ones(k),
                              np.full(k, FIRST), Mode.TRAIN)
        wake = shm.REQUEST
        if kind == 'header':
          for field in rng.sample(range(8), rng.randint(1, 8)):
            segment.header[field] = rng.choice([-1, 0, 1, 2, num + 1, 2**62, -2**63,
                                                rng.getrandbits(63)])
        elif kind == 'ids':
          segment.ids[0, :k] = [rng.choice([-1, NUM_ENVS, 2**62, (first + num) % NUM_ENVS,
                                            first]) for _ in range(k)]
          segment.ids[1, :k] = rng.getrandbits(63)
        elif kind == 'values':
          segment.observation[:k] = rng.choice([np.nan, np.inf, -3e38, 3e38])
          segment.transition[:, :k] = rng.choice([np.nan, -np.inf, 3e38, 7.0])
        elif kind == 'random segment':
          raw[:] = np.frombuffer(rng.randbytes(len(raw)), np.uint8)
        elif kind == 'burst':
          wake = shm.REQUEST * rng.randint(2, 16)
        elif kind == 'garbage bytes':
          wake = rng.randbytes(rng.randint(1, 16))
        elif kind in _ONE_FIELD_WRONG:
          array, row, value, _ = _ONE_FIELD_WRONG[kind]
          target = getattr(segment, array)
          if row is None:
            target[:k] = value
          else:
            target[row, :k] = value
        clean = clean and kind in ('valid', 'values', 'ids') + tuple(_ONE_FIELD_WRONG)
        conn.sendall(wake)
        if kind == 'close early':
          return
        ready, _, _ = select.select([conn], [], [], _REPLY_WAIT_S)
        if not ready:
          self.counts['frame unanswered'] += 1
          clean = False
          continue
        received = conn.recv(64)
        if not received:
          self.counts['detached'] += 1
          return
        if kind in _ONE_FIELD_WRONG and clean and received == shm.REPLY:
          reply = segment.read_reply()
          field = _ONE_FIELD_WRONG[kind][3]
          named = field in reply.get('refused', '')
          self.counts['refused by name' if named else 'not refused by name'] += 1
          if not named:
            self.misnamed.append((kind, reply))
    except OSError:
      self.counts['reset'] += 1
    finally:
      raw = None
      segment.close()
      conn.close()

  def case(self):
    (self.frames if self.rng.random() < 0.15 else self.hello)()


# A request with one field wrong: (segment array, row or None, value, the field its
# refusal must name).
_ONE_FIELD_WRONG = {
    'nan observation': ('observation', None, np.nan, 'observation'),
    'inf observation': ('observation', None, -np.inf, 'observation'),
    'nan reward': ('transition', 0, np.nan, 'reward'),
    'inf reward': ('transition', 0, np.inf, 'reward'),
    'huge reward': ('transition', 0, 3e38, 'reward'),
    'nan discount': ('transition', 1, np.nan, 'discount'),
    'discount past 1': ('transition', 1, 1.5, 'discount'),
    'no step type': ('transition', 2, 5.0, 'step_type'),
}


def _served(server, first=0, num=2):
  transport = ShmTransport.attach(server.offer(os.getpid()), first, num,
                                  threading.Event(), 'honest actor')
  try:
    ids = np.arange(first, first + num)
    return transport.step(ids, np.full(num, 1), np.full((num, 3), 2.0, np.float32),
                          np.zeros(num), np.ones(num), np.full(num, FIRST), Mode.TRAIN)
  finally:
    transport.close()


@pytest.mark.timeout(max(120, CASES // 10))
def test_the_same_host_socket_survives_thousands_of_hostile_inputs():
  server = ServerProcess()
  try:
    rng = random.Random(SEED)
    fuzzer = _Fuzzer(rng, server.offer(os.getpid()))
    np.testing.assert_array_equal(_served(server)['action'], [3, 3])
    warm_up = max(100, CASES // 10)
    started = time.monotonic()
    for i in range(CASES):
      if i == warm_up:
        for c in fuzzer.open_conns:
          c.close()
        fuzzer.open_conns = []
        before = server.stats()
        fds_before = server.settled_fds(timeout_s=10)
      if time.monotonic() - started > 100 and i % 100 == 0:
        fuzzer.offer = server.offer(os.getpid())  # tickets live 120 s
      fuzzer.case()
      assert server.alive(), f'the server died at case {i}: {fuzzer.counts}'
    elapsed = time.monotonic() - started
    for c in fuzzer.open_conns:
      c.close()
    np.testing.assert_array_equal(_served(server, NUM_ENVS - 2, 2)['action'], [3, 3])
    fds_after = server.settled_fds(timeout_s=20, expect=fds_before)
    after = server.stats()
    print(f'\nshm fuzz: {CASES} connections in {elapsed:.1f}s (seed {SEED}); server '
          f'RSS {before["rss_kb"]} -> {after["rss_kb"]} kB after warm-up, fds '
          f'{fds_before} -> {fds_after}, threads {before["threads"]} -> '
          f'{after["threads"]}; served {after["served"]} batches\n'
          + json.dumps(dict(sorted(fuzzer.counts.items())), indent=1))
    assert fds_after == fds_before, (fds_before, fds_after)
    assert after['attached'] == 0
    assert after['rss_kb'] - before['rss_kb'] < RSS_SLACK_KB, (before, after)
    assert fuzzer.counts['answered'] > CASES // 4  # refusals were read, not only resets
    assert fuzzer.counts['attached'] > CASES // 20
    assert not fuzzer.misnamed, fuzzer.misnamed[:5]
    assert fuzzer.counts['refused by name'] > CASES // 100
  finally:
    server.close()
