"""Serving same-host actors through shared memory (`seedacme.wire.shm`).

The central node runs one `ShmServer` beside its Courier server when shared memory is
on (`ProgramConfig.transport`). An actor on the same host attaches over a Unix socket
and gets its own segment. From then on ONE serving thread waits (epoll) on every
attached actor's socket, takes the requests of all actors that are ready together and
hands them to the `InferenceServer` as one group (`serve_group`): validation, batching
with whatever Courier requests are waiting, accounting and trajectories are the Courier
path's. It writes each reply into its segment and wakes each actor. A bad request is
refused to that actor only, by name, as on Courier; so is a request for envs the actor
did not attach with.

Why one thread, not one per actor as Courier's handler threads: measured at 8 actors x
1 env (`bench/acting.py --configs catch:8:1`, load ~2), a thread per actor spent the
central node's CPU on waking threads and handing the GIL between them; one loop that
collects whatever is ready serves the same batches without those hand-offs
(docs/benchmarks.md, "Shared memory").

Faults: a killed actor's socket reads end-of-file at once and its slot is freed (the
kernel frees the memory when the actor's mapping is gone too); its restarted process
attaches again with a new run id. When this server closes (the node stops or dies),
every actor reads end-of-file and re-attaches through Courier to the next central
process, whose `generation` differs.
"""

import collections
import os
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
_HELLO_TIMEOUT_S = 5.0


class _Slot:
  """One attached actor: its connection, segment and env ids."""

  def __init__(self, conn: socket.socket, segment: shm.Segment, envs: range):
    self.conn, self.segment, self.envs = conn, segment, envs

  @property
  def key(self) -> Tuple[int, int]:
    return (self.envs.start, len(self.envs))


class ShmServer:
  """Attaches same-host actors and serves their requests from shared memory."""

  def __init__(self, server: InferenceServer, spec: EnvSpec, num_envs: int,
               max_request_envs: int = 4096):
    self._server = server
    self._spec = spec
    self._num_envs = num_envs
    self._max_request_envs = max_request_envs
    self.generation = int.from_bytes(os.urandom(8), 'little') >> 1
    self.address = shm.new_address(self.generation)
    self._boot_id = shm.boot_id()
    self._lock = threading.Condition()
    self._attached: Dict[Tuple[int, int], _Slot | None] = {}  # None: being attached
    self._new_slots: collections.deque = collections.deque()
    self._closed = False
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

  def offer(self) -> Dict[str, object]:
    """What an actor needs to attach (sent over Courier, the control plane)."""
    return {'boot_id': self._boot_id, 'address': self.address,
            'generation': self.generation}

  @property
  def attached_actors(self) -> int:
    with self._lock:
      return sum(slot is not None for slot in self._attached.values())

  # ---- attaching (a short-lived thread per connecting actor) -------------------------
  def _accept_loop(self) -> None:
    while not self._closed:
      try:
        conn, _ = self._listener.accept()
      except OSError:
        return  # closed
      threading.Thread(target=self._attach, args=(conn,), daemon=True,
                       name='shm-attach').start()

  def _read_hello(self, conn: socket.socket) -> shm.Hello:
    conn.settimeout(_HELLO_TIMEOUT_S)
    data = b''
    while not data.endswith(b'\n'):
      chunk = conn.recv(shm.MAX_HELLO_BYTES)
      if not chunk:
        raise ConnectionResetError('the actor left while attaching')
      data += chunk
      if len(data) > shm.MAX_HELLO_BYTES:
        raise InvalidRequestError('attach message too long')
    conn.settimeout(None)
    try:
      return shm.Hello.from_json(data)
    except (ValueError, KeyError, TypeError) as e:
      raise InvalidRequestError(f'attach message unreadable: {e}') from None

  def _check(self, hello: shm.Hello) -> None:
    if hello.generation != self.generation:
      raise InvalidRequestError(
          f'stale generation {hello.generation}: this central process is generation '
          f'{self.generation} (ask shm_offer again)')
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

  def _attach(self, conn: socket.socket) -> None:
    key = None
    try:
      hello = self._read_hello(conn)
      self._check(hello)
      key = (hello.first_env_id, hello.num_envs)
      self._claim(key)
      segment = shm.Segment.create(self._spec, hello.num_envs, self.generation)
      try:
        shm.send_segment(conn, segment)
      finally:
        segment.release_descriptor()
      envs = range(hello.first_env_id, hello.first_env_id + hello.num_envs)
      with self._lock:
        if self._closed:
          segment.close()
          raise ConnectionAbortedError('the server closed')
        self._attached[key] = slot = _Slot(conn, segment, envs)
        self._new_slots.append(slot)
      os.eventfd_write(self._wake, 1)
      logging.info('shm: actor with envs %d..%d attached', envs[0], envs[-1])
      return
    except InvalidRequestError as e:
      try:
        shm.send_error(conn, str(e))
      except OSError:
        pass
    except OSError as e:
      if not self._closed:
        logging.info('shm: an attach ended early (%s)', e)
    with self._lock:  # not attached: release the reservation
      if key is not None and self._attached.get(key) is None:
        self._attached.pop(key, None)
      self._lock.notify_all()
    conn.close()

  # ---- serving (one thread for every attached actor) ---------------------------------
  def _detach(self, slot: _Slot, why: str) -> None:
    try:
      self._selector.unregister(slot.conn)
    except (KeyError, ValueError):
      pass
    with self._lock:
      if self._attached.get(slot.key) is slot:
        del self._attached[slot.key]
      self._lock.notify_all()
    slot.conn.close()
    slot.segment.close()
    logging.info('shm: actor with envs %d..%d detached (%s); its slot is free',
                 slot.envs[0], slot.envs[-1], why)

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
        ready = self._ready(1.0)
        if not ready:
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
    finally:
      with self._lock:
        slots = [s for s in self._attached.values() if s is not None]
      for slot in slots:
        self._detach(slot, 'the server closed')
      self._selector.close()

  def _serve(self, ready: List[_Slot]) -> None:
    results = self._server.serve_group([s.segment.request() for s in ready],
                                       [s.envs for s in ready])
    for slot, result in zip(ready, results):
      if isinstance(result, InvalidRequestError):
        slot.segment.write_reply(None, error=str(result))
      else:
        slot.segment.write_reply(result)
      try:
        slot.conn.sendall(shm.REPLY)
      except OSError as e:
        self._detach(slot, f'{type(e).__name__}: {e}')

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops attaching and serving: every actor reads end-of-file and re-attaches
    (through Courier) to whatever serves next."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
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
