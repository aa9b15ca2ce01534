"""The same-host data path: one actor's requests and replies in a shared-memory segment.

Courier costs ~490 us of an actor's CPU and ~620 us of the central node's per request
here (docs/benchmarks.md), while a round trip through shared memory with a one-byte
wake-up each way costs ~6 us per side (`bench/wakeup.py`). So when an actor runs on
the central node's host, its requests skip Courier: the central node gives it a
`Segment` -- the three arrays of a request (`seedacme.wire.protocol`), its mode, and the
reply's actions (int32 indices or float32 vectors) or refusal, as numpy views of one shared mapping -- and one Unix stream
socket per actor carries the wake-ups (one byte each way per request).

Why these kernel objects (measured in `bench/wakeup.py`; docs/benchmarks.md):

* The segment is a `memfd` passed over the socket (SCM_RIGHTS), not a `/dev/shm` name:
  the kernel frees it when the last process holding it exits, so nothing outlives a run,
  a Ctrl-C or a `kill -9` of any node, and there is no name to unlink or to clash.
* The wake-up is the socket itself: ~2 us more CPU per side than an eventfd, but a
  dead peer reads as end-of-file at once, which is how the central node frees a killed
  actor's slot and how an actor notices a restarted central node (no heartbeat, no
  timeouts to tune). The socket is in Linux's abstract namespace: no file to remove.

Courier stays the control plane: an actor asks the central node `shm_offer()` (its host
identity -- the kernel's boot id -- the socket's address and its generation, a random id
per central process) and attaches only when the boot id is its own. Everything else
(run ids, refusals, restarts) is the same protocol as over Courier.

Connection protocol: the actor connects and sends one JSON line (`Hello`); the server
answers with one JSON message (the segment's layout, or an `error`) carrying the
segment's file descriptor. Then per request the actor writes the segment and sends
`REQUEST`; the server serves it, writes the reply and sends `REPLY`.
"""

import dataclasses
import json
import mmap
import os
import socket
from typing import Any, Dict, Tuple

import numpy as np

from seedacme.types import EnvSpec, Mode

REQUEST = b'q'
REPLY = b'a'
# Reply status (header field STATUS).
OK, REFUSED, SHUTTING_DOWN = 0, 1, 2
MESSAGE_BYTES = 2048
# Header fields, int64 each.
GENERATION, SIZE, MODE, STATUS, MESSAGE_LENGTH = range(5)
_HEADER_FIELDS = 8
_MODES = (Mode.TRAIN, Mode.EVAL)
_ALIGN = 64
MAX_HELLO_BYTES = 4096


def boot_id() -> str:
  """This kernel's boot id: equal for two processes iff they share a host."""
  with open('/proc/sys/kernel/random/boot_id') as f:
    return f.read().strip()


def new_address(generation: int) -> str:
  """An abstract-namespace Unix socket address (no file; gone when closed)."""
  return f'\0seedacme-{os.getpid()}-{generation:x}'


def _aligned(offset: int) -> int:
  return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each array of one actor's segment lives (sent to the actor as JSON)."""
  capacity: int  # K: the most envs one request carries
  observation_shape: Tuple[int, ...]
  observation_dtype: str
  generation: int
  action_shape: Tuple[int, ...] = ()  # () for a discrete action (one int32 per env)
  action_dtype: str = 'int32'

  def offsets(self) -> Dict[str, int]:
    k = self.capacity
    obs_bytes = int(np.prod(self.observation_shape, dtype=np.int64)) * k * \
        np.dtype(self.observation_dtype).itemsize
    sizes = (('header', 8 * _HEADER_FIELDS), ('ids', 8 * 2 * k), ('transition', 4 * 3 * k),
             ('observation', obs_bytes), ('action', self.action_bytes() * k),
             ('message', MESSAGE_BYTES))
    offsets, at = {}, 0
    for name, size in sizes:
      offsets[name] = at
      at = _aligned(at + size)
    offsets['size'] = at
    return offsets

  def action_bytes(self) -> int:
    """Bytes of one env's action."""
    return int(np.prod(self.action_shape, dtype=np.int64)) * \
        np.dtype(self.action_dtype).itemsize

  def to_json(self) -> bytes:
    return json.dumps({'capacity': self.capacity,
                       'observation_shape': list(self.observation_shape),
                       'observation_dtype': self.observation_dtype,
                       'generation': self.generation,
                       'action_shape': list(self.action_shape),
                       'action_dtype': self.action_dtype}).encode()

  @classmethod
  def from_json(cls, data: Dict[str, Any]) -> 'Layout':
    return cls(int(data['capacity']), tuple(int(d) for d in data['observation_shape']),
               str(data['observation_dtype']), int(data['generation']),
               tuple(int(d) for d in data.get('action_shape', ())),
               str(data.get('action_dtype', 'int32')))


class Segment:
  """One actor's shared arrays: numpy views of a memfd mapping.

  Both sides hold one: the server creates it (`Segment.create`), the actor maps the
  descriptor it received (`Segment.attach`). `close` drops the views and the mapping;
  the memory goes back to the kernel when the last holder closes (or dies).
  """

  def __init__(self, layout: Layout, fd: int):
    self.layout = layout
    self.fd = fd
    offsets = layout.offsets()
    self._map = mmap.mmap(fd, offsets['size'])
    k = layout.capacity
    buf = self._map
    self.header = np.ndarray((_HEADER_FIELDS,), np.int64, buf, offsets['header'])
    self.ids = np.ndarray((2, k), np.int64, buf, offsets['ids'])
    self.transition = np.ndarray((3, k), np.float32, buf, offsets['transition'])
    self.observation = np.ndarray((k,) + tuple(layout.observation_shape),
                                  np.dtype(layout.observation_dtype), buf,
                                  offsets['observation'])
    self.action = np.ndarray((k,) + tuple(layout.action_shape),
                             np.dtype(layout.action_dtype), buf, offsets['action'])
    self.message = np.ndarray((MESSAGE_BYTES,), np.uint8, buf, offsets['message'])

  @classmethod
  def create(cls, spec: EnvSpec, capacity: int, generation: int) -> 'Segment':
    layout = Layout(capacity, tuple(spec.observation_shape), spec.observation_dtype,
                    generation, tuple(spec.action_shape), spec.action_dtype.name)
    fd = os.memfd_create('seedacme-actor-segment', os.MFD_CLOEXEC)
    os.ftruncate(fd, layout.offsets()['size'])
    segment = cls(layout, fd)
    segment.header[GENERATION] = generation
    return segment

  @classmethod
  def attach(cls, layout: Layout, fd: int) -> 'Segment':
    segment = cls(layout, fd)
    segment.release_descriptor()  # the mapping keeps the memory (and its own dup)
    return segment

  def release_descriptor(self) -> None:
    """Closes the descriptor once it is not needed any more (mapped here, and sent
    to the actor): one open file per side and segment."""
    if self.fd is not None:
      os.close(self.fd)
      self.fd = None

  # ---- the actor's side ------------------------------------------------------------
  def write_request(self, env_ids, run_ids, observation, reward, discount, step_type,
                    mode: Mode) -> None:
    k = len(env_ids)
    if k > self.layout.capacity:
      raise ValueError(f'{k} envs in one request; this segment holds '
                       f'{self.layout.capacity}')
    self.header[SIZE] = k
    self.header[MODE] = _MODES.index(mode)
    self.ids[0, :k] = env_ids
    self.ids[1, :k] = run_ids
    self.transition[0, :k] = reward
    self.transition[1, :k] = discount
    self.transition[2, :k] = step_type
    self.observation[:k] = observation

  def read_reply(self) -> Dict[str, Any]:
    """The reply as a Courier reply would read: `{'action'}`, `{'shutting_down'}`;
    a refusal as `{'refused': message}`."""
    status = int(self.header[STATUS])
    if status == OK:
      return {'action': self.action[:int(self.header[SIZE])].copy()}
    message = self.message[:int(self.header[MESSAGE_LENGTH])].tobytes().decode(
        'utf-8', 'replace')
    if status == SHUTTING_DOWN:
      return {'shutting_down': message}
    return {'refused': message}

  # ---- the server's side -----------------------------------------------------------
  @property
  def size(self) -> int:
    """Envs in the request in the slot (a half-batch actor sends K/2 of its K)."""
    return int(self.header[SIZE])

  def request(self) -> Dict[str, Any]:
    """The request in the actor's slot, in the wire format `validate_request` reads
    (views, not copies: valid until the reply is sent)."""
    k = int(self.header[SIZE])
    if not 0 < k <= self.layout.capacity:
      k = max(0, min(k, self.layout.capacity))  # validation names the empty request
    mode = int(self.header[MODE])
    return {'ids': self.ids[:, :k], 'transition': self.transition[:, :k],
            'observation': self.observation[:k],
            'mode': _MODES[mode].value if mode in (0, 1) else f'<mode {mode}>'}

  def write_reply(self, reply: Dict[str, Any] | None, error: str | None = None) -> None:
    if error is not None or 'shutting_down' in reply:
      status, text = (REFUSED, error) if error is not None else \
          (SHUTTING_DOWN, str(reply['shutting_down']))
      data = text.encode()[:MESSAGE_BYTES]
      self.message[:len(data)] = np.frombuffer(data, np.uint8)
      self.header[MESSAGE_LENGTH] = len(data)
      self.header[STATUS] = status
      return
    action = reply['action']
    self.action[:len(action)] = action
    self.header[STATUS] = OK

  def close(self) -> None:
    for name in ('header', 'ids', 'transition', 'observation', 'action', 'message'):
      setattr(self, name, None)
    try:
      self._map.close()
    finally:
      self.release_descriptor()


@dataclasses.dataclass(frozen=True)
class Hello:
  """What an actor says when it connects: which envs it steps, for which server."""
  first_env_id: int
  num_envs: int
  generation: int

  def to_json(self) -> bytes:
    return json.dumps(dataclasses.asdict(self)).encode() + b'\n'

  @classmethod
  def from_json(cls, data: bytes) -> 'Hello':
    fields = json.loads(data.decode())
    return cls(int(fields['first_env_id']), int(fields['num_envs']),
               int(fields['generation']))


def send_segment(conn: socket.socket, segment: Segment) -> None:
  socket.send_fds(conn, [segment.layout.to_json()], [segment.fd])


def send_error(conn: socket.socket, message: str) -> None:
  conn.sendall(json.dumps({'error': message}).encode())


def receive_segment(conn: socket.socket) -> Segment:
  """The segment the server sent, or `ConnectionRefusedError` with its reason."""
  data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
  if not data:
    for fd in fds:
      os.close(fd)
    raise ConnectionResetError('the server closed the connection while attaching')
  message = json.loads(data.decode())
  if 'error' in message:
    for fd in fds:
      os.close(fd)
    raise ConnectionRefusedError(message['error'])
  if len(fds) != 1:
    raise ConnectionResetError(f'expected one segment descriptor, got {len(fds)}')
  return Segment.attach(Layout.from_json(message), fds[0])
