"""Serving same-host actors through shared memory (`seedacme.wire.shm`).

The central node runs one `ShmServer` beside its Courier server when shared memory is
on (`ProgramConfig.transport`). An actor on the same host asks `shm_offer(pid)` over
Courier, attaches over a Unix socket and gets its own segment. From then on ONE serving
thread waits (epoll) on every attached actor's socket, copies the requests of all
actors that are ready out of their segments and hands them to the `InferenceServer` as
one group (`serve_group`): validation, batching with whatever Courier requests are
waiting, accounting and trajectories are the Courier path's. It writes each reply into
its segment and wakes each actor. A bad request is refused to that actor only, by name,
as on Courier; so is a request for envs the actor did not attach with.

Why one thread, not one per actor as Courier's handler threads: measured at 8 actors x
1 env (`bench/acting.py --configs catch:8:1`, load ~2), a thread per actor spent the
central node's CPU on waking threads and handing the GIL between them; one loop that
collects whatever is ready serves the same batches without those hand-offs
(docs/benchmarks.md, "Shared memory").

A reproducible run's server gates training batches by rounds (`seedacme.serving.rounds`):
a request is served only once every training env has asked, and a round's first call
waits for the learner. The one loop cannot wait there -- the requests that complete the
round may be ones only it can read -- so with a round gate it hands each ready actor's
request to a short-lived thread of its own (the Courier path's shape, one thread per
waiting actor) and goes back to reading. Shared memory stays on: it is the faster
transport, and the gate, not the transport, decides what is served together. A slot's
lock keeps a detach (its actor gone) from closing the segment under a thread that is
still writing the reply.

Trust (DESIGN.md, "Trust boundaries"; how an attach is authenticated:
`seedacme.wire.shm`): any local process can find the socket, so

* attaching: a peer of another uid, or whose pid no offer was made for, is refused
  on accept, before it is read; at most `MAX_HELLOS` hellos are read at once (the
  kernel's backlog queues the rest), each within one deadline (`HELLO_DEADLINE_S`);
  a hello carrying file descriptors is refused (they are closed unlooked-at); an
  `accept` that fails (EMFILE, ENFILE, ...) is logged and retried after a pause;
* tickets (`Offers`): a MAC of the process's pid and start time, checked against the
  connecting peer's `SO_PEERCRED` pid; nothing is stored per ticket, so offers asked
  for other pids void none (issue 47: eight offers for a victim's pid, or 4,096 for
  any, evicted its one-use ticket from the bounded table this replaced). Offers are
  made only for live processes of this uid in this PID namespace;
* segments are created sealed at their size (`seedacme.wire.shm`): an actor cannot
  shrink the file under the server's mapping (SIGBUS; issue 47);
* serving: requests are validated on private copies (`Segment.request`); an exception
  in a batch fails that batch's actors with a named `failed` reply (they retry, as
  after a failed Courier call; actions no env may take stop the run, as on Courier:
  `InferenceServer.policy_error`), never the loop; wake-ups are sent without blocking:
  an actor that stops reading them is detached, with the reason logged.

Faults: a killed actor's socket reads end-of-file at once and its slot is freed (the
kernel frees the memory when the actor's mapping is gone too); its restarted process
attaches again with a new run id. When this server closes (the node stops or dies),
every actor reads end-of-file and re-attaches through Courier to the next central
process, whose `generation` differs.

Why ~580 lines: it is a small server that must survive hostile local peers: peer
credentials and per-process tickets, a capped accept path with one deadline per hello and
back-off on EMFILE, non-blocking wake-ups that detach a deaf peer, and the serving loop
that fails a batch, never itself. Each part is short; they share the slot table and its
lock.
"""

import collections
import hashlib
import hmac
import os
import secrets
import selectors
import socket
import threading
import time
from typing import Dict, List, Tuple

from absl import logging

from seedacme.serving.server import InferenceServer
from seedacme.types import EnvSpec
from seedacme.wire import shm
from seedacme.wire.protocol import InvalidRequestError

# How long an attach waits for an overlapping, just-died actor's slot to be freed.
_OVERLAP_WAIT_S = 3.0
HELLO_DEADLINE_S = 2.0  # connect to a complete hello (an actor sends it at once)
MAX_HELLOS = 16  # hellos read at once
_MAX_PID = 2**22  # Linux's largest pid_max
OFFER_TTL_S = 120.0  # an unused ticket expires
MAX_OFFERS = 4096  # processes holding offers at once
_ACCEPT_BACKOFF_S = (0.01, 1.0)
_MAX_FDS_READ = 4  # descriptors received with a hello to close (more: closed by the kernel)


class _Slot:
  """One attached actor: its connection, segment and env ids."""

  def __init__(self, conn: socket.socket, segment: shm.Segment, envs: range):
    self.conn, self.segment, self.envs = conn, segment, envs
    self.detached = False
    self.lock = threading.Lock()  # segment access vs. a detach (round-gated serving)
    self.serving = False  # round-gated: a thread serves its request (until the wake-up)

  @property
  def key(self) -> Tuple[int, int]:
    return (self.envs.start, len(self.envs))


class _Throttled:
  """A warning at most once per `interval_s`, with how many were held back."""

  def __init__(self, interval_s: float = 5.0):
    self._interval_s = interval_s
    self._next = 0.0
    self._held = 0

  def warning(self, fmt: str, *args) -> None:
    now = time.monotonic()
    if now < self._next:
      self._held += 1
      return
    held, self._held, self._next = self._held, 0, now + self._interval_s
    logging.warning(fmt + (f' ({held} more like it not logged)' if held else ''), *args)


def process_identity(pid: int) -> Tuple[int, int] | None:
  """(effective uid, start time in clock ticks since boot) of process `pid` in this
  PID namespace; None when there is none. The pair names one process: a pid is reused,
  a pid with its start time is not."""
  try:
    with open(f'/proc/{pid}/status', 'rb') as f:
      status = f.read()
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read()
    uid = next(int(line.split()[2]) for line in status.splitlines()
               if line.startswith(b'Uid:'))
    # Fields after the command (which may hold spaces and parentheses): state is the
    # 3rd field of the line, start time the 22nd.
    return uid, int(stat[stat.rindex(b')') + 2:].split()[19])
  except (OSError, ValueError, IndexError, StopIteration):
    return None


class OfferRefusedError(ValueError):
  """No ticket can be made for that pid (not a live process of the server's uid here)."""


class Offers:
  """Attach tickets handed out over Courier, each bound to one process (its pid and
  start time) and expiring: `<expiry>.<MAC of pid, start time, expiry>` under a key
  only this server holds. Nothing is kept per ticket, so no call, for any pid, voids
  another's (issue 47: the bounded table of one-use tickets this replaced let eight
  offers for a victim's pid, or 4,096 for any pids, evict the victim's). Kept per
  offered process: its start time and latest expiry, so that a stranger is refused
  before its hello is read (`admits`). Offers are made for live processes of the
  server's uid only, so entries are bounded by those processes; past `MAX_OFFERS`
  live entries an offer for yet another process is refused, never an entry evicted.
  Not thread-safe: the server's lock guards `issue` and `admits` (`redeem` reads
  nothing shared)."""

  def __init__(self, uid: int | None = None):
    self._uid = os.geteuid() if uid is None else uid
    self._key = secrets.token_bytes(32)
    self._offered: Dict[int, Tuple[int, float]] = {}  # pid -> (start time, expires)

  def _mac(self, pid: int, start: int, expires_ms: int) -> str:
    return hmac.new(self._key, f'{pid}:{start}:{expires_ms}'.encode(),
                    hashlib.sha256).hexdigest()

  def _prune(self, now: float) -> None:
    for pid, (start, expires) in list(self._offered.items()):
      identity = process_identity(pid)
      if expires <= now or identity is None or identity[1] != start:
        del self._offered[pid]

  def issue(self, pid: int) -> str:
    identity = process_identity(pid)
    if identity is None or identity[0] != self._uid:
      raise OfferRefusedError(
          f'pid {pid} is no process of uid {self._uid} in the inference server\'s PID '
          'namespace (another namespace, another user, or gone): no shared memory for it')
    start, now = identity[1], time.monotonic()
    if pid not in self._offered and len(self._offered) >= MAX_OFFERS:
      self._prune(now)
      if len(self._offered) >= MAX_OFFERS:
        raise OfferRefusedError(f'{MAX_OFFERS} live processes hold offers; no more '
                                'are made until theirs expire')
    expires_ms = int((now + OFFER_TTL_S) * 1000)
    self._offered[pid] = (start, expires_ms / 1000)
    return f'{expires_ms}.{self._mac(pid, start, expires_ms)}'

  def admits(self, pid: int) -> bool:
    """Whether an unexpired offer was made for `pid` (its hello may be read)."""
    entry = self._offered.get(pid)
    if entry is not None and entry[1] <= time.monotonic():
      del self._offered[pid]
      entry = None
    return entry is not None

  def redeem(self, pid: int, ticket: str) -> bool:
    """Whether `ticket` was made for the process that is `pid` now, and is unexpired."""
    expires_ms, _, mac = ticket.partition('.')
    try:
      expires_ms = int(expires_ms)
    except ValueError:
      return False
    if expires_ms <= time.monotonic() * 1000:
      return False
    identity = process_identity(pid)
    return identity is not None and identity[0] == self._uid and hmac.compare_digest(
        mac.encode(), self._mac(pid, identity[1], expires_ms).encode())


class ShmServer:
  """Attaches same-host actors and serves their requests from shared memory."""

  def __init__(self, server: InferenceServer, spec: EnvSpec, num_envs: int,
               max_request_envs: int = 4096):
    self._server = server
    self._spec = spec
    self._num_envs = num_envs
    self._max_request_envs = max_request_envs
    self.generation = int.from_bytes(os.urandom(8), 'little') >> 1
    self.address = shm.new_address()
    self._boot_id = shm.boot_id()
    self._uid = os.geteuid()
    self._lock = threading.Condition()
    self._attached: Dict[Tuple[int, int], _Slot | None] = {}  # None: being attached
    self._new_slots: collections.deque = collections.deque()
    self._offers = Offers(self._uid)
    self._hellos = 0  # hellos being read (attach threads)
    self._closed = False
    self._refusals = _Throttled()
    self._accept_errors = _Throttled()
    self._batch_errors = _Throttled()
    self.failed_batches = 0
    self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    self._selector = selectors.DefaultSelector()
    self._selector.register(self._wake, selectors.EVENT_READ, None)
    self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._listener.bind(self.address)
    self._listener.listen(256)
    self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                           name='shm-accept')
    self._serve_thread = threading.Thread(target=self._serve_loop, daemon=True,
                                          name='shm-serve')
    self._accept_thread.start()
    self._serve_thread.start()

  def offer(self, pid: int | None = None) -> Dict[str, object]:
    """What the actor process `pid` needs to attach (sent over Courier, the control
    plane), with a ticket bound to that process; None: this process (an in-process
    actor, a test). When no ticket can be made for it, `refused` says why (and
    `ticket` is empty): the actor uses Courier, or stops with that reason."""
    if pid is None:
      pid = os.getpid()
    elif isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= _MAX_PID:
      shown = f' {pid}' if isinstance(pid, int) and abs(pid) < 10**12 else ''
      raise InvalidRequestError(f'shm_offer: pid must be an int in [1, {_MAX_PID}], got '
                                f'{type(pid).__name__}{shown}')
    offer = {'boot_id': self._boot_id, 'address': self.address,
             'generation': self.generation, 'pid': pid, 'ticket': ''}
    try:
      with self._lock:
        offer['ticket'] = self._offers.issue(pid)
    except OfferRefusedError as e:
      offer['refused'] = str(e)
    return offer

  @property
  def attached_actors(self) -> int:
    with self._lock:
      return sum(slot is not None for slot in self._attached.values())

  # ---- attaching (an accept loop; a short-lived thread per admitted hello) -----------
  def _accept_loop(self) -> None:
    backoff = _ACCEPT_BACKOFF_S[0]
    while True:
      with self._lock:  # at most MAX_HELLOS at once; the backlog holds the rest
        while not self._closed and self._hellos >= MAX_HELLOS:
          self._lock.wait(1.0)
        if self._closed:
          return
      try:
        conn, _ = self._listener.accept()
      except OSError as e:
        if self._closed:
          return
        # EMFILE/ENFILE (no descriptor for the connection), ENOBUFS, ...: the
        # connection waits in the backlog; so does this loop, then it tries again.
        self._accept_errors.warning('shm: accept failed (%s); retrying in %.2fs', e,
                                    backoff)
        with self._lock:
          self._lock.wait_for(lambda: self._closed, backoff)
        backoff = min(2 * backoff, _ACCEPT_BACKOFF_S[1])
        continue
      backoff = _ACCEPT_BACKOFF_S[0]
      pid = self._admit(conn)
      if pid is None:
        continue
      try:
        threading.Thread(target=self._attach, args=(conn, pid), daemon=True,
                         name='shm-attach').start()
      except RuntimeError as e:  # no thread to be had
        self._refuse(conn, f'the server cannot attach now ({e})')
        self._hello_done()

  def _refuse(self, conn: socket.socket, why: str) -> None:
    try:
      shm.send_error(conn, why, block=False)
    except OSError:
      pass
    conn.close()

  def _admit(self, conn: socket.socket) -> int | None:
    """The peer's pid when its credentials admit it to say hello (counted as a hello
    being read); None after refusing it."""
    try:
      pid, uid, _ = shm.peer_credentials(conn)
    except OSError as e:
      self._refuse(conn, f'no peer credentials ({e})')
      return None
    with self._lock:
      if uid != self._uid:
        why = f'uid {uid} may not attach: this server runs as uid {self._uid}'
      elif not self._offers.admits(pid):
        why = (f'no shared-memory offer is outstanding for pid {pid}: ask shm_offer '
               'over Courier with this process\'s pid (os.getpid()); its ticket is '
               'good until it expires')
      else:
        self._hellos += 1
        return pid
    self._refusals.warning('shm: refused an attach from pid %d uid %d: %s', pid, uid,
                           why)
    self._refuse(conn, why)
    return None

  def _hello_done(self) -> None:
    """A hello was read (or not): its place is free."""
    with self._lock:
      self._hellos -= 1
      self._lock.notify_all()

  def _read_hello(self, conn: socket.socket) -> shm.Hello:
    """The actor's hello, complete within one deadline from now (not per read)."""
    deadline = time.monotonic() + HELLO_DEADLINE_S
    data = b''
    while not data.endswith(b'\n'):
      left = deadline - time.monotonic()
      if left <= 0:
        raise TimeoutError(f'no complete attach message within {HELLO_DEADLINE_S}s')
      conn.settimeout(left)
      chunk, fds, flags, _ = socket.recv_fds(conn, shm.MAX_HELLO_BYTES, _MAX_FDS_READ)
      for fd in fds:  # descriptors are never read from an actor: closed unlooked-at
        os.close(fd)
      if fds or flags & socket.MSG_CTRUNC:
        raise InvalidRequestError('the attach message carries file descriptors; none '
                                  'are expected')
      if not chunk:
        raise ConnectionResetError('the actor left while attaching')
      data += chunk
      if len(data) > shm.MAX_HELLO_BYTES:
        raise InvalidRequestError('attach message too long')
    try:
      return shm.Hello.from_json(data)
    except (ValueError, KeyError, TypeError) as e:
      raise InvalidRequestError(f'attach message unreadable: {e}') from None

  def _check(self, hello: shm.Hello, pid: int) -> None:
    redeemed = self._offers.redeem(pid, hello.ticket)
    if hello.generation != self.generation:
      raise InvalidRequestError(
          f'stale generation {hello.generation}: this central process is generation '
          f'{self.generation} (ask shm_offer again)')
    if not redeemed:
      raise InvalidRequestError(
          f'attach ticket not valid for pid {pid}: unknown, expired or made for '
          'another process (ask shm_offer again, with this process\'s pid)')
    if hello.num_envs < 1 or hello.num_envs > self._max_request_envs:
      raise InvalidRequestError(f'num_envs {hello.num_envs} outside 1..'
                                f'{self._max_request_envs}')
    if hello.first_env_id < 0 or hello.first_env_id + hello.num_envs > self._num_envs:
      raise InvalidRequestError(
          f'env ids {hello.first_env_id}..{hello.first_env_id + hello.num_envs - 1} '
          f'are unknown; this server has env ids 0..{self._num_envs - 1}')

  def _claim(self, key: Tuple[int, int]) -> None:
    """Reserves the actor's envs; waits briefly for an overlapping actor that just
    died (its slot is freed when its end-of-file is read) before refusing."""
    first, num = key

    def overlapping():
      return [k for k in self._attached if k[0] < first + num and first < k[0] + k[1]]

    with self._lock:
      if not self._lock.wait_for(lambda: not overlapping(), _OVERLAP_WAIT_S):
        f2, n2 = overlapping()[0]
        raise InvalidRequestError(
            f'env ids {first}..{first + num - 1} overlap envs {f2}..{f2 + n2 - 1}, '
            f'attached by another live actor')
      self._attached[key] = None

  def _attach(self, conn: socket.socket, pid: int) -> None:
    key = segment = None
    try:
      try:
        hello = self._read_hello(conn)
      finally:
        self._hello_done()  # the claim below is bounded
      self._check(hello, pid)
      key = (hello.first_env_id, hello.num_envs)
      self._claim(key)
      segment = shm.Segment.create(self._spec, hello.num_envs, self.generation)
      try:
        conn.settimeout(HELLO_DEADLINE_S)
        shm.send_segment(conn, segment)
      finally:
        segment.release_descriptor()
      conn.setblocking(False)  # the serving loop never waits on one actor
      envs = range(hello.first_env_id, hello.first_env_id + hello.num_envs)
      with self._lock:
        if self._closed:
          raise ConnectionAbortedError('the server closed')
        self._attached[key] = slot = _Slot(conn, segment, envs)
        self._new_slots.append(slot)
      os.eventfd_write(self._wake, 1)
      logging.info('shm: actor pid %d with envs %d..%d attached', pid, envs[0], envs[-1])
      return
    except InvalidRequestError as e:
      self._refusals.warning('shm: refused an attach from pid %d: %s', pid, e)
      try:
        shm.send_error(conn, str(e))
      except OSError:
        pass
    except OSError as e:
      if not self._closed:
        logging.info('shm: an attach from pid %d ended early (%s)', pid, e)
    except Exception as e:  # pylint: disable=broad-except
      logging.exception('shm: an attach from pid %d failed', pid)
      try:
        shm.send_error(conn, f'the server failed to attach: {type(e).__name__}: {e}')
      except OSError:
        pass
    if segment is not None:
      segment.close()
    with self._lock:  # not attached: release the reservation
      if key is not None and self._attached.get(key) is None:
        self._attached.pop(key, None)
      self._lock.notify_all()
    conn.close()

  # ---- serving (one thread for every attached actor) ---------------------------------
  def _detach(self, slot: _Slot, why: str, warn: bool = False) -> None:
    with slot.lock:
      if slot.detached:
        return
      slot.detached = True
      try:
        self._selector.unregister(slot.conn)
      except (KeyError, ValueError):
        pass
      # Its descriptors and mapping go before its envs are free: a successor claiming
      # them, or anyone counting attached actors, never sees a free slot still holding
      # them.
      slot.conn.close()
      slot.segment.close()
    with self._lock:
      if self._attached.get(slot.key) is slot:
        del self._attached[slot.key]
      self._lock.notify_all()
    (logging.warning if warn else logging.info)(
        'shm: actor with envs %d..%d detached (%s); its slot is free', slot.envs[0],
        slot.envs[-1], why)

  def _ready(self, timeout: float) -> List[_Slot]:
    """The slots whose actor sent a request within `timeout` (detaches the ones whose
    actor went away; watches newly attached ones)."""
    ready = []
    for key, _ in self._selector.select(timeout=timeout):
      slot = key.data
      if slot is None:  # woken: new slots to watch, or closing
        try:
          os.eventfd_read(self._wake)
        except BlockingIOError:
          pass
        while self._new_slots:
          new = self._new_slots.popleft()
          self._selector.register(new.conn, selectors.EVENT_READ, new)
        continue
      try:
        woke = slot.conn.recv(16)
      except BlockingIOError:
        continue
      except OSError as e:
        self._detach(slot, f'{type(e).__name__}: {e}')
        continue
      if not woke:
        self._detach(slot, 'its connection closed')
        continue
      ready.append(slot)
    return ready

  def _serve_loop(self) -> None:
    try:
      while not self._closed:
        ready: List[_Slot] = []
        try:
          ready = self._ready(1.0)
          if not ready:
            continue
          if self._server.rounds is not None:
            # Round-gated: each actor's request waits for its round on its own thread
            # (one at a time per actor: a wake-up sent before its reply is dropped).
            for slot in dict.fromkeys(ready):
              if not slot.serving:
                slot.serving = True
                threading.Thread(target=self._serve_alone, args=(slot,), daemon=True,
                                 name='shm-round').start()
            continue
          # Wait for the batch to fill as the batcher would (`inference_batch_envs`,
          # the batch timeout): more actors may be a few microseconds behind.
          envs, timeout_s = self._server.batch_wait
          deadline = time.monotonic() + timeout_s
          units = sum(s.segment.size for s in ready)
          while units < envs and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
              break
            more = self._ready(left)
            ready += more
            units += sum(s.segment.size for s in more)
          self._serve(ready)
        except Exception as e:  # pylint: disable=broad-except
          # Not the batch (`_serve` answers for it): the loop's own machinery. Its
          # actors would wait for ever: detach them (they attach again).
          logging.exception('shm: the serving loop failed; detaching %d waiting actors '
                            'and serving on', len(ready))
          for slot in ready:
            self._detach(slot, f'serving failed: {type(e).__name__}: {e}', warn=True)
          time.sleep(0.01)  # no busy loop should it fail again at once
    finally:
      with self._lock:
        slots = [s for s in self._attached.values() if s is not None]
      for slot in slots:
        self._detach(slot, 'the server closed')
      self._selector.close()

  def _serve_alone(self, slot: _Slot) -> None:
    """A round-gated actor's request, on its own thread (module docstring)."""
    try:
      self._serve([slot])
    except Exception as e:  # pylint: disable=broad-except
      logging.exception('shm: serving the actor with envs %d..%d failed; detaching it',
                        slot.envs[0], slot.envs[-1])
      self._detach(slot, f'serving failed: {type(e).__name__}: {e}', warn=True)
    # `serving` ends in `_serve`, before the wake-up (not here: the loop may already
    # have handed the actor's next request to a new thread).

  def _serve(self, ready: List[_Slot]) -> None:
    # An actor that left while the batch filled is gone; one that woke the server
    # twice is served once.
    requests = []
    for slot in dict.fromkeys(ready):
      with slot.lock:
        if not slot.detached:
          requests.append((slot, slot.segment.request()))
    ready = [slot for slot, _ in requests]
    if not ready:
      return
    try:
      results = self._server.serve_group([r for _, r in requests],
                                         [s.envs for s in ready])
    except Exception as e:  # pylint: disable=broad-except
      # The batch failed (the policy, the trajectory sink, ...): its actors get a
      # named failure and retry, as Courier callers do after a failed call.
      self.failed_batches += 1
      failure = (f'the inference batch failed on the server: {type(e).__name__}: '
                 f'{str(e)[:1000]}')
      self._batch_errors.warning('shm: %s (%d actors told; serving on)', failure,
                                 len(ready))
      results = [_Failure(failure)] * len(ready)
    for slot, result in zip(ready, results):
      with slot.lock:
        if slot.detached:  # its actor went away while the batch ran
          continue
        if isinstance(result, InvalidRequestError):
          slot.segment.write_reply(None, error=str(result))
        elif isinstance(result, _Failure):
          slot.segment.write_reply(None, failed=result.message)
        elif isinstance(result, BaseException):
          slot.segment.write_reply(None, failed=f'{type(result).__name__}: {result}')
        else:
          slot.segment.write_reply(result)
      slot.serving = False  # before the wake-up: the actor's next request may follow it
      self._wake_actor(slot)

  def _wake_actor(self, slot: _Slot) -> None:
    """Sends the reply's wake-up without blocking: a well-behaved actor reads each
    before it sends its next request, so a full socket means it stopped reading."""
    try:
      sent = slot.conn.send(shm.REPLY)
    except BlockingIOError:
      sent = 0
    except OSError as e:
      self._detach(slot, f'{type(e).__name__}: {e}')
      return
    if not sent:
      self._detach(slot, 'its actor stopped reading its wake-ups (its socket is full)',
                   warn=True)

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops attaching and serving: every actor reads end-of-file and re-attaches
    (through Courier) to whatever serves next."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      self._lock.notify_all()
    try:
      self._listener.shutdown(socket.SHUT_RDWR)
    except OSError:
      pass
    self._listener.close()
    os.eventfd_write(self._wake, 1)
    self._serve_thread.join(timeout_s)
    self._accept_thread.join(timeout_s)
    if not self._serve_thread.is_alive():
      os.close(self._wake)


class _Failure:
  """A batch's failure, as its actors are told."""

  def __init__(self, message: str):
    self.message = message
