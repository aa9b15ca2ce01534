"""Authenticate before parse: a host's replicas listen only in a private namespace, and
the one thing on the host's address is a mutual-TLS endpoint in front of them.

Courier 0.5 and Reverb 0.7 bind `[::]:port` in their C++ (no address argument) and
authenticate no one, and Courier's deserializer imports and calls what a payload names
before any handler of ours runs (`seedacme.wire.courier_guard`). A list of names in
front of such a parser cannot be made safe name by name, so between hosts no byte of a
peer reaches Courier or Reverb before the peer has shown a certificate of this run.
The shape is a Kubernetes pod's sidecar:

    host namespace                              private namespace (only `lo`)
    ┌──────────────────────────────────┐        ┌──────────────────────────────────┐
    │ Tunnel (this module's main)      │  fds   │ keeper (`unshare -rn`, PID N)    │
    │  · TLS 1.3 listener on the spec's│◀──────▶│  makes sockets in here on request│
    │    address of each own replica   │ SCM_   │  (connect 127.0.0.1:port,        │
    │  · after the handshake: bytes to │ RIGHTS │   listen on an alias port)       │
    │    a socket connected in here    │        │ replicas: `nsenter -t N -U -n`   │
    │  · alias listeners in here ──▶   │        │  Courier, Reverb, the same-host  │
    │    TLS to the remote endpoint    │        │  socket: reachable from here only│
    └──────────────────────────────────┘        └──────────────────────────────────┘

One process holds sockets of both namespaces: the keeper, which lives in the private
namespace, makes a socket there when asked and hands its file descriptor over a Unix
socket pair (a socket keeps the namespace it was made in), so a byte crosses one Python
relay per host, not two. Inside the namespace each replica sees the cluster spec
rewritten (`local_spec`): its own host's replicas at their ports on 127.0.0.1, every
other replica at an alias port on 127.0.0.1 whose listener the tunnel carries to that
replica's host over TLS.

TLS: Python's `ssl` (OpenSSL), TLS 1.3 only, `CERT_REQUIRED` on both sides, the run's
CA as the only trust root; a client also checks that the server's certificate names
the address it dialled (IP SAN), and the endpoint refuses a peer that connects from an
address its certificate does not name (a leaf copied elsewhere; `address_problem`), so
a host dials from its spec address. A refusal is counted (`Counters`, printed by the
launcher at exit) and logged at most once a minute per peer and port. Credentials: `ensure_run_ca` makes a CA per run in
`<logdir>/tls` (the first host to start wins an atomic rename; directory 0700, files
0600) and each host issues its own leaf (`issue_leaf`) for its address; or a user's own
(`--tls_dir`: `ca.pem` plus this host's `cert.pem` and `key.pem`, or `ca.pem` and
`ca.key` to issue from). Keys never go to a `gs://` logdir: there, `--tls_dir` is
required. Why these pieces rather than stunnel or grpcio's SSL credentials: nothing new
to install on a host (stunnel is a Debian package; `cryptography` is already in the
lock), Courier and Reverb take no credentials of their own in these versions, and a
relay that takes file descriptors from the namespace is one hop, which stunnel is not.

Measured cost (`bench/acting.py --cross_host`, bench/published/acting_tls.json: Catch,
central inference over Courier, actors on another emulated host, one run each on 2
cores at load 6-10): 2 actors x 16 envs, 3,589 env steps/s through the tunnel vs 3,045
plain (1.18: within this machine's noise); 4 actors x 1 env, 249 vs 374 (0.67). The
cost is the relay's CPU per request, ~0.9 ms per round trip summed over both hosts'
sidecars (57 us per env step at 16 envs a request, 954 at 1), taken from the cores the
actors and the learner share: batching envs per actor amortizes it (clusters default
to 32 envs per actor); TLS itself (AES-GCM on small messages) is not where it goes.
A relay on asyncio protocols instead of streams, or a C relay, would cut it.

Why ~560 lines: credentials (CA, leaves, contexts), the spec rewrite, the keeper that
lives in the namespace, and the relay are one mechanism; split, each would need the
others' invariants restated.
"""

import argparse
import asyncio
import datetime
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, NamedTuple, Sequence, Tuple

CA_CERT, CA_KEY, CERT, KEY = 'ca.pem', 'ca.key', 'cert.pem', 'key.pem'
CA_DAYS, LEAF_DAYS = 365, 30
HANDSHAKE_TIMEOUT_S = 10.0
_CHUNK = 1 << 16


class TunnelError(RuntimeError):
  """The tunnel cannot start; the message says why."""


# ---------------------------------------------------------------------------------------
# Credentials


def _write_private(path: str, data: bytes) -> None:
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(fd, 'wb') as f:
    f.write(data)


def _name(common_name: str):
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top
  return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def _new_key():
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())


def make_ca(directory: str, run_name: str) -> None:
  """Writes a new CA (`ca.pem`, `ca.key` 0600) for run `run_name` into `directory`."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=g-import-not-at-top
  key = _new_key()
  now = datetime.datetime.now(datetime.timezone.utc)
  name = _name(f'seedacme run CA {run_name}')
  cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(key, hashes.SHA256()))
  _write_private(os.path.join(directory, CA_KEY), _pem_key(key))
  _write_private(os.path.join(directory, CA_CERT), cert.public_bytes(serialization.Encoding.PEM))


def ensure_run_ca(directory: str, run_name: str) -> str:
  """The run's CA directory `directory`, made by whichever host gets there first (built
  aside, then renamed: a host that loses the race uses the winner's)."""
  if os.path.isfile(os.path.join(directory, CA_CERT)):
    return directory
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix='.tls-', dir=parent)  # mode 0700
  try:
    make_ca(staging, run_name)
    os.rename(staging, directory)
  except OSError:
    shutil.rmtree(staging, ignore_errors=True)
    if not os.path.isfile(os.path.join(directory, CA_CERT)):
      raise
  return directory


def issue_leaf(ca_dir: str, address: str, out_dir: str, run_name: str) -> Tuple[str, str]:
  """Issues this host's certificate for `address` (its IP SAN, or DNS name) from the CA
  in `ca_dir`; writes `cert.pem`/`key.pem` (0600) into `out_dir`; returns their paths."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import ExtendedKeyUsageOID  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ca_dir, CA_KEY), 'rb') as f:
    ca_key = serialization.load_pem_private_key(f.read(), None)
  with open(os.path.join(ca_dir, CA_CERT), 'rb') as f:
    ca_cert = x509.load_pem_x509_certificate(f.read())
  try:
    alt = x509.IPAddress(ipaddress.ip_address(address.strip('[]')))
  except ValueError:
    alt = x509.DNSName(address)
  key = _new_key()
  now = datetime.datetime.now(datetime.timezone.utc)
  cert = (x509.CertificateBuilder().subject_name(_name(f'seedacme {run_name} {address}'))
          .issuer_name(ca_cert.subject).public_key(key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
          .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
          .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
          .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                ExtendedKeyUsageOID.CLIENT_AUTH]),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
  cert_path, key_path = os.path.join(out_dir, CERT), os.path.join(out_dir, KEY)
  for path in (cert_path, key_path):
    if os.path.exists(path):
      os.remove(path)
  _write_private(key_path, _pem_key(key))
  _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
  return cert_path, key_path


class Credentials(NamedTuple):
  ca: str    # the run's CA certificate: the only trust root
  cert: str  # this host's certificate
  key: str


def host_credentials(logdir: str, tls_dir: str | None, address: str, run_name: str,
                     work_dir: str) -> Credentials:
  """This host's credentials: from `tls_dir` (the user's own) or the run's CA in
  `<logdir>/tls`, with a leaf issued into `work_dir` (a private temp dir)."""
  if tls_dir:
    ca = os.path.join(tls_dir, CA_CERT)
    if not os.path.isfile(ca):
      raise TunnelError(f'--tls_dir {tls_dir} has no {CA_CERT}')
    if os.path.isfile(os.path.join(tls_dir, CERT)) and os.path.isfile(os.path.join(tls_dir, KEY)):
      return Credentials(ca, os.path.join(tls_dir, CERT), os.path.join(tls_dir, KEY))
    if not os.path.isfile(os.path.join(tls_dir, CA_KEY)):
      raise TunnelError(f'--tls_dir {tls_dir} needs this host\'s {CERT} and {KEY}, or '
                        f'{CA_KEY} to issue them from')
    return Credentials(ca, *issue_leaf(tls_dir, address, work_dir, run_name))
  if '://' in logdir:
    raise TunnelError(f'the logdir {logdir} is a bucket: keys are not written there; '
                      'give every host --tls_dir (ca.pem and its own cert.pem/key.pem)')
  ca_dir = ensure_run_ca(os.path.join(logdir, 'tls'), run_name)
  return Credentials(os.path.join(ca_dir, CA_CERT),
                     *issue_leaf(ca_dir, address, work_dir, run_name))


def contexts(creds: Credentials) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
  """(server, client) contexts: TLS 1.3, a certificate of the run required both ways."""
  made = []
  for purpose in (ssl.Purpose.CLIENT_AUTH, ssl.Purpose.SERVER_AUTH):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH
                         else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=creds.ca)  # the run's CA only: no system roots
    ctx.load_cert_chain(creds.cert, creds.key)
    made.append(ctx)
  made[1].check_hostname = True  # the server's certificate names the address dialled
  return made[0], made[1]


# ---------------------------------------------------------------------------------------
# The spec as a host's replicas see it


class Plan(NamedTuple):
  """What one host's tunnel does: `inbound` (own replica ports, bound on `address`),
  `outbound` (alias port in the namespace -> remote host, port)."""
  address: str
  inbound: List[int]
  outbound: Dict[int, Tuple[str, int]]


def _split(address: str) -> Tuple[str, int]:
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def plan(spec: Dict[str, List[str]], mine: Sequence[Tuple[str, int]]
         ) -> Tuple[Plan, Dict[str, List[str]]]:
  """This host's `Plan` and the cluster spec its replicas see (own replicas on
  127.0.0.1 at their ports; others at alias ports). Raises TunnelError when this
  host's replicas name more than one address."""
  own = {_split(spec[pool][i]) for pool, i in mine}
  hosts = {h for h, _ in own}
  if len(hosts) != 1:
    raise TunnelError(f'the replicas this host starts must share one address in the '
                      f'cluster spec (the one its TLS endpoint binds), got {sorted(hosts)}')
  address = hosts.pop()
  own_ports = {p for _, p in own}
  used = set(own_ports)
  outbound: Dict[int, Tuple[str, int]] = {}
  by_remote: Dict[Tuple[str, int], int] = {}
  local: Dict[str, List[str]] = {}
  for pool, addresses in spec.items():
    local[pool] = []
    for i, entry in enumerate(addresses):
      host, port = _split(entry)
      if (pool, i) in mine or (host == address and port in own_ports):
        local[pool].append(f'127.0.0.1:{port}')
        continue
      if (host, port) not in by_remote:
        alias = port
        while alias in used:
          alias = 20000 + (alias * 7919) % 40000
        used.add(alias)
        by_remote[(host, port)] = alias
        outbound[alias] = (host, port)
      local[pool].append(f'127.0.0.1:{by_remote[(host, port)]}')
  return Plan(address, sorted(own_ports), outbound), local


# ---------------------------------------------------------------------------------------
# The keeper: lives in the private namespace, makes sockets there on request


def _keeper(control_fd: int) -> int:
  """Serves `connect <port>` and `listen <port>` on the control socket: answers with
  the new socket's fd (SCM_RIGHTS) or an error line. Ends when the tunnel goes."""
  control = socket.socket(fileno=control_fd)
  buffer = b''
  while True:
    data = control.recv(4096)
    if not data:
      return 0
    buffer += data
    while b'\n' in buffer:
      line, buffer = buffer.split(b'\n', 1)
      verb, _, port = line.decode().partition(' ')
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      try:
        if verb == 'listen':
          sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
          sock.bind(('127.0.0.1', int(port)))
          sock.listen(128)
        else:
          sock.settimeout(5)
          sock.connect(('127.0.0.1', int(port)))
        socket.send_fds(control, [b'ok\n'], [sock.fileno()])
      except OSError as e:
        control.sendall(f'error {e.strerror or e}\n'.encode())
      finally:
        sock.close()


class _Keeper:
  """The tunnel's side of the keeper: one request at a time."""

  def __init__(self, control: socket.socket):
    self._control = control
    self._lock = threading.Lock()

  def socket(self, verb: str, port: int) -> socket.socket:
    with self._lock:
      self._control.sendall(f'{verb} {port}\n'.encode())
      message, fds, _, _ = socket.recv_fds(self._control, 256, 1)
    if not message.startswith(b'ok') or not fds:
      for fd in fds:
        os.close(fd)
      raise OSError(f'{verb} 127.0.0.1:{port} in the private namespace: '
                    f'{message.decode(errors="replace").strip() or "keeper gone"}')
    return socket.socket(fileno=fds[0])


# ---------------------------------------------------------------------------------------
# The relay


_said: Dict[str, float] = {}


def _say(line: str) -> None:
  """Logs `line` to stderr at most once a minute per peer and port (a scan must not
  flood the launcher's log; the counters count every refusal)."""
  key, now = line.split(' at ')[0], time.monotonic()
  if now - _said.get(key, -60.0) >= 60.0:
    _said[key] = now
    print(f'tls_tunnel: {line}', file=sys.stderr, flush=True)


class Counters:
  """What the endpoint saw: connections to its TLS ports, handshakes refused and
  completed, and bytes forwarded after a handshake."""

  def __init__(self):
    self.connections = self.refused = self.accepted = self.forwarded = 0

  def as_dict(self) -> Dict[str, int]:
    return dict(connections=self.connections, refused=self.refused,
                accepted=self.accepted, forwarded=self.forwarded)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                counters: Counters) -> None:
  try:
    while True:
      data = await reader.read(_CHUNK)
      if not data:
        break
      counters.forwarded += len(data)
      writer.write(data)
      await writer.drain()
  except (ConnectionError, OSError, asyncio.IncompleteReadError):
    pass
  finally:
    writer.close()


async def _join(a, b, counters: Counters) -> None:
  """Copies both ways until either side ends, then closes both."""
  for _, w in (a, b):
    sock = w.get_extra_info('socket')
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
      sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  await asyncio.wait([asyncio.ensure_future(_pipe(a[0], b[1], counters)),
                      asyncio.ensure_future(_pipe(b[0], a[1], counters))],
                     return_when=asyncio.FIRST_COMPLETED)
  a[1].close()
  b[1].close()


async def _handshake(reader, writer, ctx: ssl.SSLContext):
  """The server side of TLS on an accepted connection (Python 3.10's streams have no
  `start_tls`): a writer on the TLS transport; the reader is fed through it."""
  loop = asyncio.get_running_loop()
  protocol = writer.transport.get_protocol()
  tls = await loop.start_tls(writer.transport, protocol, ctx, server_side=True,
                             ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
  protocol._over_ssl = True  # pylint: disable=protected-access  (set at connection_made)
  return reader, asyncio.StreamWriter(tls, protocol, reader, loop)


def _sans(cert: Dict) -> List[str]:
  return [value for kind, value in cert.get('subjectAltName', ()) if kind == 'IP Address']


def address_problem(peer: str, cert: Dict) -> str | None:
  """Why a peer of the run is refused anyway: it connects from an address its
  certificate does not name (a leaf copied to another machine). None: it names it.
  Certificates naming no IP (DNS names: `--tls_dir`'s own) are not checked."""
  sans = _sans(cert)
  if not sans:
    return None
  source = ipaddress.ip_address(peer.split('%')[0])
  if source.version == 6 and source.ipv4_mapped is not None:
    source = source.ipv4_mapped
  if any(ipaddress.ip_address(s.strip()) == source for s in sans):
    return None
  return f'connects from {source}, its certificate names {", ".join(sans)}'


async def _serve(plan_: Plan, keeper: _Keeper, server_ctx: ssl.SSLContext,
                 client_ctx: ssl.SSLContext, counters: Counters, ready) -> None:
  loop = asyncio.get_running_loop()
  servers = []

  def inbound(port):
    async def handle(reader, writer):
      counters.connections += 1
      peer = (writer.get_extra_info('peername') or ('?',))[0]
      try:  # nothing is read from the peer but its handshake, and nothing forwarded
        here = await _handshake(reader, writer, server_ctx)
        problem = address_problem(peer, here[1].get_extra_info('peercert') or {})
      except (ssl.SSLError, OSError, asyncio.TimeoutError, ConnectionError) as e:
        problem = f'{type(e).__name__}: {e}'
      if problem:
        counters.refused += 1
        _say(f'refused {peer} on port {port} at the handshake ({problem})')
        writer.transport.abort()
        return
      counters.accepted += 1
      try:
        inner = await loop.run_in_executor(None, keeper.socket, 'connect', port)
        there = await asyncio.open_connection(sock=inner)
      except OSError:
        here[1].close()
        return
      await _join(here, there, counters)
    return handle

  def outbound(host, port):
    async def handle(reader, writer):
      try:
        there = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=client_ctx, server_hostname=host,
            local_addr=(plan_.address, 0),  # the address its certificate names
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S), HANDSHAKE_TIMEOUT_S + 5)
      except (OSError, asyncio.TimeoutError, ssl.SSLError):
        writer.close()
        return
      await _join((reader, writer), there, counters)
    return handle

  for port in plan_.inbound:
    servers.append(await asyncio.start_server(
        inbound(port), host=plan_.address, port=port, reuse_address=True))
  for alias, (host, port) in plan_.outbound.items():
    listener = await loop.run_in_executor(None, keeper.socket, 'listen', alias)
    servers.append(await asyncio.start_server(outbound(host, port), sock=listener))
  ready()
  await asyncio.Event().wait()  # until cancelled


# ---------------------------------------------------------------------------------------
# The tunnel as the launcher uses it


def namespace_problem() -> str | None:
  """Why a private user+network namespace cannot be made here (None: it can)."""
  if not shutil.which('unshare') or not shutil.which('nsenter'):
    return 'unshare/nsenter (util-linux) missing'
  probe = subprocess.run(['unshare', '-rn', 'true'], capture_output=True, text=True)
  if probe.returncode != 0:
    return probe.stderr.strip() or f'unshare exited {probe.returncode}'
  return None


class Tunnel:
  """A private namespace for this host's replicas and, when other hosts take part, the
  TLS endpoint in front of it. `prefix` runs a command inside the namespace."""

  def __init__(self, plan_: Plan | None, creds: Credentials | None):
    self.plan, self.counters = plan_, Counters()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The keeper: unshare makes the namespace, `ip` brings lo up, Python serves fds.
    self._keeper = subprocess.Popen(
        ['unshare', '-rn', '--', 'sh', '-c', 'ip link set lo up && exec "$0" "$@"',
         sys.executable, '-m', 'seedacme.wire.tls_tunnel', 'keeper', str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
    theirs.close()
    self.keeper = _Keeper(ours)
    self._loop: asyncio.AbstractEventLoop | None = None
    self._thread = None
    try:
      self.keeper.socket('listen', 0).close()  # the namespace is up, lo included
    except OSError as e:
      self.close()
      raise TunnelError(f'the private namespace did not come up: {e}') from e
    if plan_ is not None and (plan_.inbound or plan_.outbound):
      self._start_relay(creds)

  @property
  def namespace_pid(self) -> int:
    return self._keeper.pid

  def prefix(self) -> List[str]:
    """argv prefix that runs a command in the namespace (unprivileged: we own it)."""
    return ['nsenter', '-t', str(self._keeper.pid), '-U', '-n', '--preserve-credentials',
            '--']

  def _start_relay(self, creds: Credentials) -> None:
    server_ctx, client_ctx = contexts(creds)
    started, failed = threading.Event(), []

    def run():
      loop = self._loop = asyncio.new_event_loop()
      task = loop.create_task(_serve(self.plan, self.keeper, server_ctx, client_ctx,
                                     self.counters, started.set))
      try:
        loop.run_until_complete(task)
      except asyncio.CancelledError:
        pass
      except BaseException as e:  # pylint: disable=broad-except
        failed.append(e)
        started.set()
      finally:
        loop.close()

    self._thread = threading.Thread(target=run, name='tls-tunnel', daemon=True)
    self._thread.start()
    started.wait(30)
    if failed or not started.is_set():
      self.close()
      raise TunnelError(f'the TLS endpoint did not start: {failed[0] if failed else "timeout"}')

  def close(self) -> None:
    if self._loop is not None and self._thread is not None and self._loop.is_running():
      for task in asyncio.all_tasks(self._loop):
        self._loop.call_soon_threadsafe(task.cancel)
      self._thread.join(5)
    if self._keeper.poll() is None:
      self._keeper.terminate()
      try:
        self._keeper.wait(5)
      except subprocess.TimeoutExpired:
        self._keeper.kill()
        self._keeper.wait()


def _main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(prog='tls_tunnel')
  sub = parser.add_subparsers(dest='command', required=True)
  keeper = sub.add_parser('keeper', help='(internal) serve sockets of this namespace')
  keeper.add_argument('fd', type=int)
  args = parser.parse_args(argv)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  return _keeper(args.fd)


if __name__ == '__main__':
  sys.exit(_main(sys.argv[1:]))
