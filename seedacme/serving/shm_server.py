"""Serving same-host actors through shared memory (`seedacme.wire.shm`).

The central node runs one `ShmServer` beside its Courier server when shared memory is
on (`ProgramConfig.transport`). An actor on the same host attaches over a Unix socket
and gets its own segment; from then on one thread of this server per actor waits for
the actor's wake-up byte, hands the request in the segment to the `InferenceServer`
exactly as a Courier handler thread hands it a Courier request (validation, batching
across actors, accounting, trajectories: all unchanged), writes the reply into the
segment and wakes the actor. A bad request is refused to that actor only, by name, as
on Courier; so is a request for envs the actor did not attach with.

Faults: a killed actor's socket reads end-of-file at once, and its thread frees the
segment (the kernel frees the memory when the actor's mapping is gone too); its
restarted process attaches again with a new run id. When this server closes (the node
stops or dies), every actor reads end-of-file and re-attaches through Courier to the
next central process, whose `generation` differs.
"""

import os
import socket
import threading
from typing import Dict, Tuple

from absl import logging

from seedacme.serving.server import InferenceServer
from seedacme.types import EnvSpec
from seedacme.wire import shm
from seedacme.wire.protocol import InvalidRequestError

# How long an attach waits for an overlapping, just-died actor's slot to be freed.
_OVERLAP_WAIT_S = 3.0
_HELLO_TIMEOUT_S = 5.0


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
    self._attached: Dict[Tuple[int, int], socket.socket] = {}  # (first, num) -> conn
    self._threads = set()
    self._closed = False
    self.attaches = 0
    self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._listener.bind(self.address)
    self._listener.listen(256)
    self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                           name='shm-accept')
    self._accept_thread.start()

  def offer(self) -> Dict[str, object]:
    """What an actor needs to attach (sent over Courier, the control plane)."""
    return {'boot_id': self._boot_id, 'address': self.address,
            'generation': self.generation}

  @property
  def attached_actors(self) -> int:
    with self._lock:
      return len(self._attached)

  def _accept_loop(self) -> None:
    while not self._closed:
      try:
        conn, _ = self._listener.accept()
      except OSError:
        return  # closed
      thread = threading.Thread(target=self._serve_actor, args=(conn,), daemon=True,
                                name='shm-actor')
      with self._lock:
        self._threads.add(thread)
      thread.start()

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

  def _claim(self, key: Tuple[int, int], conn: socket.socket) -> None:
    """Records the actor's envs as attached; waits briefly for an overlapping actor
    that just died (its thread frees the slot on end-of-file) before refusing."""
    first, num = key

    def overlapping():
      return [k for k in self._attached if k[0] < first + num and first < k[0] + k[1]]

    with self._lock:
      if not self._lock.wait_for(lambda: not overlapping(), _OVERLAP_WAIT_S):
        (f2, n2), = overlapping()[:1]
        raise InvalidRequestError(
            f'env ids {first}..{first + num - 1} overlap envs {f2}..{f2 + n2 - 1}, '
            f'attached by another live actor')
      self._attached[key] = conn
      self.attaches += 1

  def _serve_actor(self, conn: socket.socket) -> None:
    key = segment = None
    try:
      try:
        hello = self._read_hello(conn)
        self._check(hello)
        key = (hello.first_env_id, hello.num_envs)
        self._claim(key, conn)
      except InvalidRequestError as e:
        shm.send_error(conn, str(e))
        return
      segment = shm.Segment.create(self._spec, hello.num_envs, self.generation)
      shm.send_segment(conn, segment)
      segment.release_descriptor()
      envs = range(hello.first_env_id, hello.first_env_id + hello.num_envs)
      logging.info('shm: actor with envs %d..%d attached', envs[0], envs[-1])
      step = self._server.step
      ended = 'its connection closed'
      try:
        while conn.recv(1):  # b'': the actor exited or died
          try:
            segment.write_reply(step(segment.request(), owned=envs))
          except InvalidRequestError as e:
            segment.write_reply(None, error=str(e))
          conn.sendall(shm.REPLY)
      except OSError as e:  # the actor's end went away mid-exchange, or we are closing
        ended = f'{type(e).__name__}: {e}'
      logging.info('shm: actor with envs %d..%d detached (%s); its slot is free',
                   envs[0], envs[-1], ended)
    except OSError as e:  # while attaching
      if not self._closed:
        logging.info('shm: an attach ended early (%s)', e)
    finally:
      with self._lock:
        if key is not None and self._attached.get(key) is conn:
          del self._attached[key]
        self._threads.discard(threading.current_thread())
        self._lock.notify_all()
      if segment is not None:
        segment.close()
      conn.close()

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops attaching and serving: every actor reads end-of-file and re-attaches
    (through Courier) to whatever serves next."""
    self._closed = True
    try:
      self._listener.shutdown(socket.SHUT_RDWR)
    except OSError:
      pass
    self._listener.close()
    with self._lock:
      conns, threads = list(self._attached.values()), list(self._threads)
    for conn in conns:
      try:
        conn.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
    for thread in threads:
      thread.join(timeout_s)
    self._accept_thread.join(timeout_s)
