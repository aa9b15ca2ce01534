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
* It is sealed at its size (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before it is
  sent, and the side that receives one maps it only if those seals are on and its size
  is the layout's (`check_descriptor`): both sides map the same file, and a mapping
  read past the end of a file shrunk under it faults with SIGBUS. Unsealed (issue 47),
  an attached actor's `ftruncate(fd, 0)` killed the central node at its next header
  read; sealed, the `ftruncate` fails with EPERM, for root as for anyone.
* The wake-up is the socket itself: ~2 us more CPU per side than an eventfd, but a
  dead peer reads as end-of-file at once, which is how the central node frees a killed
  actor's slot and how an actor notices a restarted central node (no heartbeat, no
  timeouts to tune). The socket is in Linux's abstract namespace: no file to remove.

Courier stays the control plane: an actor asks the central node `shm_offer(pid)` with
its own pid; the offer carries the host's identity (the kernel's boot id), the socket's
address, the server's generation (a random id per central process) and an attach
ticket bound to that process (its pid and start time). The actor attaches only when the
boot id is its own. Everything else (run ids, refusals, restarts) is the same protocol
as over Courier.

Who may attach (the same-host path trusts only its own run's processes):

* The socket's abstract name is public -- any local process reads it in
  /proc/net/unix -- so it carries nothing that grants anything (the server's pid and a
  counter). The ticket, the only secret, travels in the Courier reply, where the rest
  of the run's traffic travels (Courier's boundary: loopback in a private network
  namespace locally, the user's private network between hosts).
* On accept, the server reads the peer's credentials from the kernel (`SO_PEERCRED`,
  which the peer cannot forge): another uid is refused, and so is a pid no offer was
  made for -- before reading a byte, so strangers cost the server no hello slot.
* The hello must present a ticket made for that very process: a MAC of its pid, its
  start time (/proc/<pid>/stat) and an expiry, under a key only the server holds
  (`seedacme.serving.shm_server.Offers`). Binding to the pid, not only to the ticket,
  means a ticket that leaks (a log, a core dump) admits no other process; binding to
  the start time means a process that inherits a dead actor's pid holds no valid
  ticket. Nothing is stored per ticket, so no Courier call, for whatever pid, can void
  another process's ticket (issue 47: with a bounded table of one-use tickets, eight
  offers for a victim's pid or 4,096 for any evicted the victim's, and an actor with
  `--transport shm` then retried for ever). An offer is made only for a live process
  of the server's uid in the server's PID namespace; an actor elsewhere gets an offer
  that says why (`refused`) and uses Courier.

Connection protocol: the actor connects and sends one JSON line (`Hello`); the server
answers with one JSON message (the segment's layout, or an `error`) carrying the
segment's file descriptor. Then per request the actor writes the segment and sends
`REQUEST`; the server copies the request out of the segment (what it validates and
serves is private: the actor can write its segment at any time), serves it, writes the
reply and sends `REPLY`.

Why ~380 lines: the segment layout, the private copy of a request, the attach messages
and descriptor passing (with the seal and size checks a received descriptor must pass)
are one wire format, read by both sides.
"""

import dataclasses
import fcntl
import itertools
import json
import mmap
import os
import socket
import struct
from typing import Any, Dict, Tuple

import numpy as np

from seedacme.types import EnvSpec, Mode

REQUEST = b'q'
REPLY = b'a'
# Reply status (header field STATUS). FAILED: the batch failed on the server (the
# actor retries, as after a failed Courier call); REFUSED: this request is wrong.
OK, REFUSED, SHUTTING_DOWN, FAILED = 0, 1, 2, 3
MESSAGE_BYTES = 2048
# Header fields, int64 each.
GENERATION, SIZE, MODE, STATUS, MESSAGE_LENGTH = range(5)
_HEADER_FIELDS = 8
_MODES = (Mode.TRAIN, Mode.EVAL)
_ALIGN = 64
MAX_HELLO_BYTES = 4096
# What a segment's memfd must carry before anyone maps it: no size change, no more seals.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class AttachRefusedError(ConnectionRefusedError):
  """An attach refused by either side, with the reason: the server's refusal, or a
  segment the actor will not map."""


def check_descriptor(fd: int, size: int) -> None:
  """Raises `AttachRefusedError` unless `fd` is a memfd sealed with `SEALS` whose size
  is `size`: a file its sender can still shrink would fault (SIGBUS) whoever maps it."""
  try:
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
  except OSError as e:  # EINVAL: not a memfd (or one made without MFD_ALLOW_SEALING)
    raise AttachRefusedError(f'the segment descriptor cannot be sealed ({e}): not a '
                             'memfd made with MFD_ALLOW_SEALING; not mapped') from None
  if seals & SEALS != SEALS:
    raise AttachRefusedError(f'the segment is not sealed against resizing (seals '
                             f'{seals:#x}, need {SEALS:#x}); not mapped')
  actual = os.fstat(fd).st_size
  if actual != size:
    raise AttachRefusedError(f'the segment holds {actual} bytes, its layout {size}; '
                             'not mapped')


def boot_id() -> str:
  """This kernel's boot id: equal for two processes iff they share a host."""
  with open('/proc/sys/kernel/random/boot_id') as f:
    return f.read().strip()


_addresses = itertools.count()


def new_address() -> str:
  """An abstract-namespace Unix socket address (no file; gone when closed). Public:
  nothing in it admits anyone. The pid and counter say whose it is; the random part keeps
  it unique across PID namespaces that share a network namespace (Bazel's linux-sandbox
  gives every test its own PID namespace on the host's network: two tests' servers, both
  pid 2, collided on pid and counter alone and the second bind failed, EADDRINUSE)."""
  return f'\0seedacme-shm-{os.getpid()}-{next(_addresses)}-{os.urandom(8).hex()}'


def peer_credentials(conn: socket.socket) -> Tuple[int, int, int]:
  """(pid, uid, gid) of the process that connected `conn`, as the kernel recorded them
  at connect (`SO_PEERCRED`)."""
  fmt = '3i'
  return struct.unpack(fmt, conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                            struct.calcsize(fmt)))


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
    fd = os.memfd_create('seedacme-actor-segment', os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
      os.ftruncate(fd, layout.offsets()['size'])
      fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
      segment = cls(layout, fd)
    except BaseException:
      os.close(fd)
      raise
    segment.header[GENERATION] = generation
    return segment

  @classmethod
  def attach(cls, layout: Layout, fd: int) -> 'Segment':
    """Maps the descriptor a peer sent, once `check_descriptor` passes."""
    check_descriptor(fd, layout.offsets()['size'])
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
    a refusal as `{'refused': message}`, a failed batch as `{'failed': message}`."""
    status = int(self.header[STATUS])
    if status == OK:
      return {'action': self.action[:int(self.header[SIZE])].copy()}
    length = max(0, min(int(self.header[MESSAGE_LENGTH]), MESSAGE_BYTES))
    message = self.message[:length].tobytes().decode('utf-8', 'replace')
    if status == SHUTTING_DOWN:
      return {'shutting_down': message}
    if status == FAILED:
      return {'failed': message}
    return {'refused': message}

  # ---- the server's side -----------------------------------------------------------
  @property
  def size(self) -> int:
    """Envs in the request in the slot (a half-batch actor sends K/2 of its K), as
    the actor wrote it, clamped to the segment (it decides no more than how long the
    server waits for a batch to fill)."""
    return max(0, min(int(self.header[SIZE]), self.layout.capacity))

  def request(self) -> Dict[str, Any]:
    """The request in the actor's slot, in the wire format `validate_request` reads,
    copied out of the shared mapping once: the actor can rewrite its segment at any
    time, so what is validated, batched and served must be a private copy. Each
    header field is read once. (Measured here, load ~3.5: +1 to 3 us per request over
    views for Catch or MuJoCo observations, +35 us for Atari's 16 x 84x84x4 bytes;
    validation costs 30 to 90 us, and the policy's input conversion copies them
    again anyway.)"""
    k = self.size
    mode = int(self.header[MODE])
    return {'ids': self.ids[:, :k].copy(), 'transition': self.transition[:, :k].copy(),
            'observation': self.observation[:k].copy(),
            'mode': _MODES[mode].value if mode in (0, 1) else f'<mode {mode}>'}

  def write_reply(self, reply: Dict[str, Any] | None, error: str | None = None,
                  failed: str | None = None) -> None:
    """The reply to the request in the slot: `reply` (`{'action'}` or
    `{'shutting_down'}`), or the refusal `error`, or `failed` (the batch failed)."""
    if error is not None or failed is not None or 'shutting_down' in reply:
      if error is not None:
        status, text = REFUSED, error
      elif failed is not None:
        status, text = FAILED, failed
      else:
        status, text = SHUTTING_DOWN, str(reply['shutting_down'])
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
  """What an actor says when it connects: which envs it steps, for which server, and
  the ticket its offer carried (made for this actor's pid)."""
  first_env_id: int
  num_envs: int
  generation: int
  ticket: str = ''

  def to_json(self) -> bytes:
    return json.dumps(dataclasses.asdict(self)).encode() + b'\n'

  @classmethod
  def from_json(cls, data: bytes) -> 'Hello':
    fields = json.loads(data.decode())
    return cls(int(fields['first_env_id']), int(fields['num_envs']),
               int(fields['generation']), str(fields.get('ticket', '')))


def send_segment(conn: socket.socket, segment: Segment) -> None:
  socket.send_fds(conn, [segment.layout.to_json()], [segment.fd])


def send_error(conn: socket.socket, message: str, block: bool = True) -> None:
  """The attach refusal `message`; `block=False`: whatever the socket takes at once."""
  data = json.dumps({'error': message}).encode()
  if block:
    conn.sendall(data)
  else:
    conn.send(data, socket.MSG_DONTWAIT)


def receive_segment(conn: socket.socket) -> Segment:
  """The segment the server sent, or `AttachRefusedError` with the server's reason
  (or why this side will not map what it sent)."""
  data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
  try:
    if not data:
      raise ConnectionResetError('the server closed the connection while attaching')
    try:
      message = json.loads(data.decode())
      if 'error' in message:
        raise AttachRefusedError(str(message['error']))
      layout = Layout.from_json(message)
      layout.offsets()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise AttachRefusedError(f'the attach reply is unreadable: {e}') from None
    if len(fds) != 1:
      raise AttachRefusedError(f'expected one segment descriptor, got {len(fds)}')
    segment = Segment.attach(layout, fds[0])
    fds = []
    return segment
  finally:
    for fd in fds:
      os.close(fd)
