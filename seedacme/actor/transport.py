"""How an actor's requests reach the inference server: Courier, or shared memory.

`InferencePath` is what `EnvActor` calls: `step(...)` with one request's fields, the
reply back. Underneath it is one of two transports, chosen when the actor attaches and
again whenever the server goes away:

* `ShmTransport` when the central node offers shared memory on this host (same kernel
  boot id): the request goes into the actor's segment, a byte on a Unix socket wakes
  the server (`seedacme.wire.shm`); at 8 actors x 1 env it cost the actor 102 us of
  CPU per env step where Courier cost 388 (docs/benchmarks.md, "Shared memory"). The
  offer is asked for this process's pid (`shm_offer(os.getpid())`): its ticket
  admits this process only. An attach the server refuses by name (or a segment this
  side will not map: `seedacme.wire.shm.check_descriptor`) falls back to Courier, or
  with `transport='shm'` is asked again at most `MAX_REFUSED_ATTACHES` times in a
  row, then stops the actor with the reason (it retried for ever: issue 47).
* `RpcTransport` otherwise: a Courier call (`client.futures.step`), or an actor's own
  inference (`seedacme.actor.actor_side`), which offers the same call.

`ProgramConfig.transport`: 'auto' (shared memory when offered here), 'courier' (the
comparison), 'shm' (shared memory or fail at attach). The actor's loop never knows.

Across hosts (issue 37, emulated hosts) two ways of waiting for good were found and
closed: a call left on a connection a partition made half-open (`RpcTransport`'s probe)
and a channel whose reconnect backoff had grown to a minute while the server was away
(fresh clients, `RECONNECT_AFTER_S`).

The first connection (issue 48, start-up) is not left to gRPC: actors are up long
before the central node serves (it imports TensorFlow and compiles inference), and a
call on a channel whose server is not listening yet makes gRPC retry the connection
with a growing backoff (1 s, 1.6 s, 2.6 s, ...): the first answer came 5.7 s after
the central node was serving (Catch V-trace, `bench/startup.py`, load ~4 on 2 cores).
A fresh client does not help while the first is alive (the actor keeps it for its
reports): gRPC's channels to one address share one connection and its backoff (a
fresh client every 0.3 s was answered 3.2 s after the server started while the first
client lived, 0.05 s once it was gone). So until the actor's first answer, no call is
made before the server's port accepts a TCP connection (`wait_for_port`, tried every
`first_connect_period`: 0.25 s, 2% of the time waited, at most 1 s); the first call
then connects at once: a server started 6 s after its actor answered it 0.01 s after
starting, 3.5-3.8 s before (`tests/unit/test_courier_transport.py`, load ~2); from
the central node's `serving` to each actor's and the evaluator's first answer,
`bench/startup.py` measured 0.9 s (Catch V-trace) and 1.4-2.1 s (MuJoCo PPO) at load
~4-5, where it was 0.4-7.5 s and 5.5-6.2 s at load ~1-3. After a first answer (a
server lost later) nothing changes.

Why ~510 lines: three ways to the server (Courier, shared memory, the choice and re-
attach between them) share one retry and patience policy; the shared-memory attach
(offer for this pid, ticket, fallback) is most of it, the Courier path's probe and
reconnect most of the rest.
"""

import os
import socket
import threading
import time
from concurrent import futures
from typing import Any, Dict

from absl import logging
import numpy as np

from seedacme.types import Mode
from seedacme.wire import courier_guard, protocol, shm

TRANSPORTS = ('auto', 'courier', 'shm')
_SLICE_S = 0.2  # waits are cut into slices so a stop request is seen at once
SLOW_CALL_WARNING_S = 5.0
# While a Courier call is unanswered, a `ping` this often on the same connection: where
# the server's end dropped the connection while a partition hid its goodbye, nothing
# else would ever be sent on it (a half-open connection: the actor waited for good).
PROBE_INTERVAL_S = 10.0
# While the server is away (not started yet, or gone), a fresh Courier client this
# often: gRPC retries a channel's connection with a backoff that grows to 120 s, so an
# actor started 2 minutes before the central node (its import and compile on a loaded
# machine) first connected ~60 s after the node was serving (emulated hosts, issue 37),
# and the run reached its target before it; a new channel tries at once.
RECONNECT_AFTER_S = 5.0
# Until an actor's first answer: its server's port is tried this often (module
# docstring): 0.25 s, 2% of the time waited, at most 1 s.
FIRST_CONNECT_MIN_S = 0.25
FIRST_CONNECT_MAX_S = 1.0
FIRST_CONNECT_FRACTION = 0.02
# transport='shm': refusals in a row (a stale generation after a restart, envs of an
# actor not yet detached) before the actor stops, naming the last.
MAX_REFUSED_ATTACHES = 5


def is_courier_client(client: Any) -> bool:
  """Whether `client` is a real Courier client (not, e.g., an actor's own inference)."""
  try:
    import courier  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return isinstance(client, courier.Client)


def fresh_client(client: Any) -> Any:
  """A new Courier client of `client`'s server, on a channel of its own (None when
  `client` is not a Courier client)."""
  if not is_courier_client(client):
    return None
  cls, args = client.__reduce__()
  return cls(*args)


def first_connect_period(waited_s: float) -> float:
  """How long after a refused TCP connection a never-answered actor tries again."""
  return min(FIRST_CONNECT_MAX_S, max(FIRST_CONNECT_MIN_S, FIRST_CONNECT_FRACTION * waited_s))


def host_port(address: str) -> tuple[str, int] | None:
  """`(host, port)` of a Courier address (`host:port`, `[v6]:port`, `dns:///host:port`),
  None for anything else (a Unix socket, a name service's name)."""
  if address.startswith('dns:///'):
    address = address[len('dns:///'):]
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit() or '/' in host:
    return None
  return host.strip('[]'), int(port)


def wait_for_port(address: str, stop: threading.Event) -> bool:
  """Waits until `address` accepts a TCP connection, trying every
  `first_connect_period`; False when stopped first or `address` is no `host:port`."""
  target = host_port(address)
  if target is None:
    return False
  started = time.monotonic()
  while not stop.is_set():
    period = first_connect_period(time.monotonic() - started)
    tried = time.monotonic()
    try:
      socket.create_connection(target, timeout=period).close()
      return True
    except OSError:
      stop.wait(max(0.0, period - (time.monotonic() - tried)))
  return False


class ServerAway(ConnectionError):
  """The server's end went away (it stopped, or is restarting): attach again."""


class _Patience:
  """Says, while one request waits, that the server has not answered: after 5 s, then
  every 30 s (gRPC waits for a restarting server by itself; a full replay table makes
  the server wait for the learner)."""

  def __init__(self, who: str, path: str):
    self._who, self._path = who, path
    self._sent = time.monotonic()
    self._next = self._sent + SLOW_CALL_WARNING_S

  def still_waiting(self) -> None:
    now = time.monotonic()
    if now >= self._next:
      logging.warning('%s: no answer from the inference server for %.0fs (%s); waiting '
                      'for it (restarting, or the learner is behind)', self._who,
                      now - self._sent, self._path)
      self._next += 30.0


def _same(value):
  return value


class RpcTransport:
  """A call per request (`client.futures.step(request)`), retried while the server is
  unreachable (gRPC waits for a restarting server by itself).

  A partition can leave the call waiting on a half-open connection: in
  `tests/integration/test_emulated_cluster.py`, 20 s with the actor's host cut off
  left the central node's end closed (its socket gone) and the actor's open, its
  request acknowledged and nothing left to send, so the kernel never learned of it
  and the actor waited past 75 s after the link was back (before this). So while a
  call waits, a `ping` goes out on the same connection every `PROBE_INTERVAL_S`:
  answered at once by a live server; on a dropped connection the server's kernel
  answers it with a reset, gRPC fails the waiting call, and the call is retried on a
  new connection. A retried request may have been served already (its reply lost):
  its envs then take that step twice, as after any failed call.
  """

  name = 'courier'

  def __init__(self, client: Any, stop: threading.Event, who: str):
    self._client = client
    self._stop = stop
    self._who = who
    # Over Courier a request travels as `courier_guard.plain` values (no pickled numpy
    # for the server to rebuild); an actor's own inference takes it as it is.
    self._encode = courier_guard.plain if fresh_client(client) is not None else _same

  def step(self, env_ids, run_ids, observation, reward, discount, step_type,
           mode: Mode) -> Dict[str, Any] | None:
    """The reply, or None once the stop event is set.

    The call is asynchronous and waited on in short slices: a process blocked inside a
    synchronous RPC cannot run its SIGTERM handler, and Launchpad would SIGKILL it.
    """
    request = protocol.make_request(env_ids, run_ids, observation, reward, discount,
                                    step_type, mode)
    backoff = 0.1
    while not self._stop.is_set():
      future = self._client.futures.step(self._encode(request))
      patience = _Patience(self._who, 'Courier')
      probe_at = time.monotonic() + PROBE_INTERVAL_S
      while True:
        try:
          return courier_guard.accept(future.result(timeout=_SLICE_S),
                                      f'{self._who}: the inference reply')
        except futures.TimeoutError:
          if self._stop.is_set():
            future.cancel()
            return None
          patience.still_waiting()
          if time.monotonic() >= probe_at:
            self._probe()
            probe_at = time.monotonic() + PROBE_INTERVAL_S
        except Exception as e:  # pylint: disable=broad-except
          refusal = protocol.as_refusal(e)
          if refusal is e:
            raise  # Our own request is wrong: retrying cannot help.
          if refusal is not None:
            raise refusal from e
          logging.warning('%s: inference call failed (%s); retrying in %.1fs', self._who,
                          str(e).strip().splitlines()[-1][:200], backoff)
          self._stop.wait(backoff)
          backoff = min(2 * backoff, 5.0)
          self._reconnect()
          break
    return None

  def _reconnect(self) -> None:
    """After a failed call (the server went away): until a `ping` is answered, a
    fresh client every `RECONNECT_AFTER_S` (see there); the request is then sent on
    the one that answered. Not for an actor's own inference."""
    if fresh_client(self._client) is None:
      return
    while not self._stop.is_set():
      client = fresh_client(self._client)
      answered = _wait(client.futures.ping(), RECONNECT_AFTER_S, self._stop)
      if answered:
        self._client = client
        return

  def _probe(self) -> None:
    """A `ping` on the call's connection (class docstring); its answer is not awaited."""
    ping = getattr(getattr(self._client, 'futures', None), 'ping', None)
    if ping is None:  # an actor's own inference: no connection to probe
      return
    try:
      ping()
    except Exception as e:  # pylint: disable=broad-except  (the call's own error tells)
      logging.info('%s: probe not sent: %s', self._who, e)

  def close(self) -> None:
    pass


def _wait(future: futures.Future, timeout_s: float, stop: threading.Event) -> bool:
  """Whether `future` is done (answered or failed) within `timeout_s`, in slices."""
  deadline = time.monotonic() + timeout_s
  while not stop.is_set() and time.monotonic() < deadline:
    try:
      future.exception(timeout=_SLICE_S)
      return True
    except futures.TimeoutError:
      continue
  future.cancel()
  return False


class ShmTransport:
  """Requests through the actor's shared-memory segment (`seedacme.wire.shm`).

  The actor waits for each reply in a plain blocking `recv`: a socket timeout (to look
  at the stop event in slices, as the Courier path does) cost ~7 us more CPU per round
  trip here (`bench/wakeup.py`, `unix_socket_timeout`). A watcher thread instead
  wakes a blocked `recv` when the stop event is set (it shuts the socket down) and says
  when an answer is slow.
  """

  name = 'shm'

  def __init__(self, conn: socket.socket, segment: shm.Segment, stop: threading.Event,
               who: str):
    self._conn = conn
    self.segment = segment
    self._stop = stop
    self._who = who
    self._sent_at: float | None = None  # while a request waits for its reply
    self._closed = False
    self._watcher = threading.Thread(target=self._watch, daemon=True, name='shm-watch')
    self._watcher.start()

  @classmethod
  def attach(cls, offer: Dict[str, Any], first_env_id: int, num_envs: int,
             stop: threading.Event, who: str) -> 'ShmTransport':
    """Connects to the offered server and maps the segment it sends; raises
    `ConnectionRefusedError` with the server's reason, or `OSError`."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
      conn.settimeout(10.0)
      conn.connect(offer['address'])
      try:
        conn.sendall(shm.Hello(first_env_id, num_envs, int(offer['generation']),
                               str(offer.get('ticket', ''))).to_json())
      except BrokenPipeError:
        pass  # refused on connecting: the reason waits to be read
      segment = shm.receive_segment(conn)
      conn.settimeout(None)
    except BaseException:
      conn.close()
      raise
    return cls(conn, segment, stop, who)

  def _watch(self) -> None:
    patience_for = None
    while not self._closed:
      if self._stop.wait(_SLICE_S):
        try:  # wakes a `recv` blocked in `step`, which then returns None
          self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass
        return
      sent_at = self._sent_at
      if sent_at is None:
        patience_for = None
      else:
        if patience_for is None or patience_for[0] != sent_at:
          patience_for = (sent_at, _Patience(self._who, 'shared memory'))
        patience_for[1].still_waiting()

  def step(self, env_ids, run_ids, observation, reward, discount, step_type,
           mode: Mode) -> Dict[str, Any] | None:
    """The reply, or None once the stop event is set. A batch that failed on the
    server is sent again after a pause, as `RpcTransport` does after a failed call."""
    backoff = 0.1
    while True:
      self.segment.write_request(env_ids, run_ids, observation, reward, discount,
                                 step_type, mode)
      try:
        self._sent_at = time.monotonic()
        self._conn.sendall(shm.REQUEST)
        woke = self._conn.recv(1)
      except OSError as e:
        if self._stop.is_set():
          return None
        raise ServerAway(f'{type(e).__name__}: {e}') from e
      finally:
        self._sent_at = None
      if not woke:
        if self._stop.is_set():
          return None
        raise ServerAway('the inference server closed the connection')
      reply = self.segment.read_reply()
      if 'refused' in reply:
        raise protocol.RemoteRefusalError(reply['refused'])
      if 'failed' not in reply:
        return reply
      logging.warning('%s: %s; retrying in %.1fs', self._who, reply['failed'][:300],
                      backoff)
      if self._stop.wait(backoff):
        return None
      backoff = min(2 * backoff, 5.0)

  def close(self) -> None:
    self._closed = True
    try:
      self._conn.close()
    finally:
      self.segment.close()


class InferencePath:
  """The actor's way to the inference server; attaches, and attaches again after the
  server went away, on shared memory when offered on this host, else Courier."""

  def __init__(self, client: Any, first_env_id: int, num_envs: int,
               stop: threading.Event, transport: str = 'auto', who: str = 'actor'):
    if transport not in TRANSPORTS:
      raise ValueError(f'transport must be one of {TRANSPORTS}, got {transport!r}')
    self._client = client
    self._first_env_id = first_env_id
    self._num_envs = num_envs
    self._stop = stop
    self._transport = transport
    self._who = who
    self.current: RpcTransport | ShmTransport | None = None
    self.attaches = 0
    self._refused = 0  # shared-memory attaches refused in a row
    self._answered = False  # ever, by the server (until then: `wait_for_port` first)
    courier_guard.install()  # replies rebuild no code (seedacme.wire.courier_guard)

  @property
  def name(self) -> str | None:
    """'shm' or 'courier' (None before the first request)."""
    return getattr(self.current, 'name', None)

  def _offer(self) -> Dict[str, Any] | None:
    """The central node's shared-memory offer for this process (None: it makes none,
    or it is not a central node), asked over Courier and retried while the node is
    unreachable."""
    offer_call = getattr(getattr(self._client, 'futures', None), 'shm_offer', None)
    if offer_call is None:  # an actor's own inference, or a stand-in without it
      return None
    backoff = 0.1
    while not self._stop.is_set():
      future = offer_call(os.getpid())
      asked = time.monotonic()
      try:
        while True:
          try:
            offer = courier_guard.accept(future.result(timeout=_SLICE_S),
                                         f'{self._who}: the shared-memory offer')
            self._answered = True
            break
          except futures.TimeoutError:
            if self._stop.is_set():
              future.cancel()
              return None
            fresh = None
            if time.monotonic() - asked >= RECONNECT_AFTER_S:
              fresh = fresh_client(self._client)
            if fresh is not None:  # not connected yet: ask on a new channel
              future.cancel()
              self._client = fresh
              offer_call = fresh.futures.shm_offer
              future, asked = offer_call(os.getpid()), time.monotonic()
        if offer is None or not offer.get('closing'):
          return offer
        self._stop.wait(1.0)  # the node is stopping: its successor, or our stop, comes
      except courier_guard.RefusedPayloadError:
        raise  # whoever answers is not our central node: retrying cannot help
      except Exception as e:  # pylint: disable=broad-except
        logging.info('%s: shared-memory offer not answered (%s); retrying in %.1fs',
                     self._who, str(e).strip().splitlines()[-1][:120], backoff)
        self._stop.wait(backoff)
        backoff = min(2 * backoff, 5.0)
    return None

  def _attach(self):
    if not self._answered and is_courier_client(self._client):
      started = time.monotonic()
      if wait_for_port(self._client.address, self._stop):
        logging.info('%s: the inference server accepts connections (after %.1fs)',
                     self._who, time.monotonic() - started)
    if self._transport == 'courier':
      return RpcTransport(self._client, self._stop, self._who)
    offer = self._offer()
    if self._stop.is_set():
      return None
    # On the client that answered the offer (maybe a fresh one).
    rpc = RpcTransport(self._client, self._stop, self._who)
    elsewhere = offer is not None and offer['boot_id'] != shm.boot_id()
    if offer is None or elsewhere or offer.get('refused'):
      why = ('runs on another host' if elsewhere else 'offers no shared memory'
             if offer is None else
             f"offers no shared memory to this process: {offer['refused']}")
      if self._transport == 'shm':
        raise RuntimeError(f'{self._who}: transport=shm, but the inference server {why}')
      logging.info('%s: the inference server %s: requests through Courier', self._who, why)
      return rpc
    try:
      path = ShmTransport.attach(offer, self._first_env_id, self._num_envs, self._stop,
                                 self._who)
    except shm.AttachRefusedError as e:  # refused by name, not away: asking for ever
      # would not help (issue 47: an actor whose ticket was voided retried for ever)
      if self._transport != 'shm':
        logging.warning('%s: shared memory refused (%s); requests through Courier',
                        self._who, e)
        return rpc
      self._refused += 1
      if self._refused >= MAX_REFUSED_ATTACHES:
        raise RuntimeError(f'{self._who}: transport=shm, but attaching was refused '
                           f'{self._refused} times in a row; last: {e}') from e
      logging.warning('%s: shared memory refused (%s); asking again', self._who, e)
      self._stop.wait(1.0)
      return None
    except OSError as e:
      if self._transport == 'shm':  # e.g. the server closed after its offer: ask again
        logging.warning('%s: shared memory not attached (%s); asking again', self._who, e)
        self._stop.wait(1.0)
        return None
      logging.warning('%s: shared memory offered but not attached (%s); requests '
                      'through Courier', self._who, e)
      return rpc
    self._refused = 0
    logging.info('%s: requests through shared memory (segment of %d envs, generation '
                 '%d)', self._who, self._num_envs, offer['generation'])
    return path

  def step(self, env_ids: np.ndarray, run_ids: np.ndarray, observation: np.ndarray,
           reward: np.ndarray, discount: np.ndarray, step_type: np.ndarray,
           mode: Mode) -> Dict[str, Any] | None:
    """The server's reply (`{'action'}` or `{'shutting_down'}`), or None once the stop
    event is set. Raises `InvalidRequestError` when the server refused the request."""
    while not self._stop.is_set():
      if self.current is None:
        self.current = self._attach()
        if self.current is None:
          continue  # not attached yet (asked again after a pause)
        self.attaches += 1
      try:
        reply = self.current.step(env_ids, run_ids, observation, reward, discount,
                                  step_type, mode)
        self._answered = self._answered or reply is not None
        return reply
      except ServerAway as e:
        logging.info('%s: the inference server went away (%s); attaching again',
                     self._who, e)
        self.close()
        self._stop.wait(0.2)
    return None

  def close(self) -> None:
    if self.current is not None:
      self.current.close()
      self.current = None
