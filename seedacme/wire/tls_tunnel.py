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

TLS: Python's `ssl` (OpenSSL), TLS 1.3 only, `CERT_REQUIRED` on both sides, the run's CA
as the only trust root; a client also checks that the server's certificate names the
address it dialled (an IP or DNS SAN), and the endpoint refuses a peer that connects
from an address its certificate does not name (a leaf copied elsewhere;
`address_problem`), so a host dials from its spec address.

Strangers who only open connections (issue 62): the endpoint accepts in a thread of its
own and lets a connection start a handshake only within a budget (`Limits`,
`Admission`). Each of the run's other hosts (the spec's addresses, names resolved) has
its own (64 at once, a 10 s deadline); every other address shares one (16 at once per
address, 256 in all, 20 a second per address, 200 in all, a 3 s deadline). Over a
budget a connection is reset before a byte of it is read; a stranger that keeps coming
over its rate is shunned, its packets dropped in the kernel by a filter on the
listeners for 30 s (doubling each time). The soft descriptor limit is raised to the
hard one. A refusal is counted by reason (`Counters`, printed by the launcher at exit);
what the endpoint says goes through `RateLog`: once a minute per peer and port or
error kind, at most 30 lines a minute, a bounded memory of keys. Measured
(tests/integration/test_tls_flood.py: a stranger emulated host flooding the central
node's host from four processes for 30 s): cross-host acting kept 0.80-1.13 of its env
steps/s, nothing timed out, 4 lines said; c8a4f53's endpoint wrote 9,195 tracebacks.

Credentials (`ensure_run_credentials`): the first host to start is a one-shot signer: it
makes the run's CA in memory, issues a leaf for every host of the cluster spec (an
address as IP SAN; a name as DNS SAN plus every address it resolves to, as IP SANs),
writes them to `<logdir>/tls/<12 hex of the spec's hosts>` (built aside, then renamed:
hosts starting together agree on one set) and drops the CA key, which is never written:
no host, no reader or copy of the logdir can mint a leaf. A set lives the run's time
budget plus a day; a resume with the same hosts reuses it while it covers the run (else
the central node's host renews it, the others wait), and that host removes it when the
run ends. `<logdir>/tls` and all in it must be this user's (directories 0700, files
0600), or it is refused naming the path and its owner. The endpoint checks a peer's
source address against its certificate's IP SANs, or, with DNS names only (a user's own
leaf), against what they resolve to; a certificate naming neither is refused. A user's
own (`--tls_dir`): `ca.pem` plus this host's `cert.pem` and `key.pem`, or `ca.pem` and
`ca.key` to issue from (which puts the CA key on every host). Keys never go to a `gs://`
logdir: there, `--tls_dir` is required.

Why these pieces rather than stunnel or grpcio's SSL credentials: nothing new
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

Why ~1,400 lines: credentials (CA, leaves, contexts), the spec rewrite, the keeper that
lives in the namespace, admission before the handshake, and the relay are one
mechanism; split, each would need the others' invariants restated.
"""

import argparse
import asyncio
import datetime
import errno
import hashlib
import ipaddress
import itertools
import json
import os
import pwd
import re
import resource
import selectors
import shutil
import signal
import socket
import ssl
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, NamedTuple, Sequence, Tuple

from seedacme.runtime import isolation

from seedacme.runtime import owned_paths

CA_CERT, CA_KEY, CERT, KEY = 'ca.pem', 'ca.key', 'cert.pem', 'key.pem'
HANDSHAKE_TIMEOUT_S = 10.0  # dialling another host's endpoint (its own: `Limits`)
_CHUNK = 1 << 16


class TunnelError(RuntimeError):
  """The tunnel cannot start; the message says why."""


# ---------------------------------------------------------------------------------------
# Credentials
#
# The run's set, `<logdir>/tls/<key>/` (`key`: 12 hex of the sha256 of the spec's
# sorted hosts): `ca.pem`, `hosts.json` (the hosts it was made for) and
# `hosts/<host>/{cert.pem,key.pem}`; directories 0700, files 0600, all this user's.

TLS_DIR, HOSTS_DIR, SET_HOSTS = 'tls', 'hosts', 'hosts.json'
MARGIN_S = 24 * 3600.0  # a set outlives the run's time budget by this: start-up, gaps
NO_BUDGET_S = 30 * 24 * 3600.0  # what a set covers for a run without a time budget
MAX_LIFETIME_S = 366 * 24 * 3600.0
MIN_LEFT_S = 3600.0  # a set with less than this left is not reused
WAIT_FOR_CENTRAL_S = 300.0  # how long a host waits for the central host to renew a set
_HOST_NAME = re.compile(r'[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?\Z')
_MISSING = 'missing'


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


def _pem_cert(cert) -> bytes:
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(path: str):
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    return x509.load_pem_x509_certificate(f.read())


def _write(path: str, data: bytes) -> None:
  """0600, never through a link or into a file someone made first."""
  try:
    owned_paths.write_private(path, data)
  except owned_paths.UnsafePathError as e:
    raise TunnelError(str(e)) from None


def _lifetime(needed_s: float | None) -> float:
  """How long a new set lives: the run's time budget still to run plus `MARGIN_S`."""
  if needed_s is None:
    return NO_BUDGET_S
  return min(max(needed_s, 0.0) + MARGIN_S, MAX_LIFETIME_S)


def _ip(text: str):
  """An address as `ipaddress` has it; an IPv4-mapped IPv6 address as IPv4."""
  address = ipaddress.ip_address(text.split('%')[0].strip().strip('[]'))
  if address.version == 6 and address.ipv4_mapped is not None:
    return address.ipv4_mapped
  return address


def _is_ip(host: str) -> bool:
  try:
    _ip(host)
    return True
  except ValueError:
    return False


def resolve_host(name: str) -> List[str]:
  """Every address `name` resolves to here ([] if none): a lookup, no connection."""
  try:
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
  except (OSError, UnicodeError):
    return []
  return sorted({str(_ip(info[4][0])) for info in infos})


def _check_host(host: str) -> str:
  if not _is_ip(host) and not _HOST_NAME.match(host):
    raise TunnelError(f'the cluster spec names host {host!r}: neither an IP address nor a '
                      'host name')
  return host


def spec_hosts(spec: Dict[str, List[str]]) -> List[str]:
  """The cluster spec's distinct hosts (addresses or names), sorted."""
  return sorted({_check_host(_split(entry)[0]) for pool in spec.values() for entry in pool})


def _new_ca(run_name: str, lifetime_s: float):
  """(key, certificate) of a new CA, in memory."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes  # pylint: disable=g-import-not-at-top
  key = _new_key()
  now = datetime.datetime.now(datetime.timezone.utc)
  name = _name(f'seedacme run CA {run_name}')
  cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(seconds=lifetime_s))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(key, hashes.SHA256()))
  return key, cert


def _new_leaf(ca_key, ca_cert, host: str, run_name: str, lifetime_s: float
              ) -> Tuple[bytes, bytes]:
  """(key PEM, certificate PEM) for `host`: its address as IP SAN, or for a name, the
  name (DNS SAN) and every address it resolves to here (IP SANs: the endpoint checks a
  peer's source against them). Lives `lifetime_s`, and no longer than its CA."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  if _is_ip(host):
    alt = [x509.IPAddress(_ip(host))]
  else:
    addresses = resolve_host(_check_host(host))
    if not addresses:
      raise TunnelError(f'the cluster spec\'s host {host} does not resolve here: its '
                        'certificate must name its addresses (every host of the run must '
                        'resolve the spec\'s names)')
    alt = [x509.DNSName(host), *(x509.IPAddress(_ip(a)) for a in addresses)]
  return _sign_leaf(ca_key, ca_cert, alt, f'seedacme {run_name} {host}', lifetime_s)


def _sign_leaf(ca_key, ca_cert, alt, subject: str, lifetime_s: float) -> Tuple[bytes, bytes]:
  """A new key and its certificate from the CA: `alt` as SANs, for server and client."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import ExtendedKeyUsageOID  # pylint: disable=g-import-not-at-top
  key = _new_key()
  now = datetime.datetime.now(datetime.timezone.utc)
  ends = min(now + datetime.timedelta(seconds=lifetime_s), ca_cert.not_valid_after_utc)
  cert = (x509.CertificateBuilder().subject_name(_name(subject))
          .issuer_name(ca_cert.subject).public_key(key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(ends)
          .add_extension(x509.SubjectAlternativeName(alt), critical=False)
          .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
          .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                ExtendedKeyUsageOID.CLIENT_AUTH]),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
  return _pem_key(key), _pem_cert(cert)


def make_ca(directory: str, run_name: str, lifetime_s: float = NO_BUDGET_S) -> None:
  """Writes a CA (`ca.pem`, and `ca.key`: 0600) into `directory`: a user's own, to
  issue from with `--tls_dir` (the run's own CA key is never written)."""
  key, cert = _new_ca(run_name, lifetime_s)
  _write(os.path.join(directory, CA_KEY), _pem_key(key))
  _write(os.path.join(directory, CA_CERT), _pem_cert(cert))


def issue_leaf(ca_dir: str, address: str, out_dir: str, run_name: str,
               lifetime_s: float = NO_BUDGET_S) -> Tuple[str, str]:
  """Issues a certificate for `address` (an IP, or a name and what it resolves to) from
  the CA in `ca_dir` (`ca.pem`, `ca.key`); writes `cert.pem`/`key.pem` (0600) into
  `out_dir`; returns their paths."""
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ca_dir, CA_KEY), 'rb') as f:
    ca_key = serialization.load_pem_private_key(f.read(), None)
  key_pem, cert_pem = _new_leaf(ca_key, load_cert(os.path.join(ca_dir, CA_CERT)),
                                address, run_name, lifetime_s)
  cert_path, key_path = os.path.join(out_dir, CERT), os.path.join(out_dir, KEY)
  for path in (cert_path, key_path):
    if os.path.lexists(path):
      os.remove(path)
  _write(key_path, key_pem)
  _write(cert_path, cert_pem)
  return cert_path, key_path


def run_credentials_dir(tls_root: str, hosts: Sequence[str]) -> str:
  """Where the run's set for `hosts` lives: keyed by them, so a spec with other hosts
  (a Slurm requeue on other nodes) gets a set of its own."""
  key = hashlib.sha256('\n'.join(sorted(set(hosts))).encode()).hexdigest()[:12]
  return os.path.join(tls_root, key)


def _owner(uid: int) -> str:
  try:
    return f'{pwd.getpwuid(uid).pw_name} (uid {uid})'
  except KeyError:
    return f'uid {uid}'


def _tree_problem(top: str) -> str | None:
  """Why the credentials under `top` are not this user's alone (every directory 0700,
  every file a regular file readable by no one else, all this uid's), or None."""
  problem = owned_paths.path_problem(top, private=True)
  for here, dirs, files in os.walk(top) if problem is None else ():
    for name in dirs:
      problem = problem or owned_paths.path_problem(os.path.join(here, name), private=True)
    for name in files:
      path = os.path.join(here, name)
      st = os.lstat(path)
      mode = stat.S_IMODE(st.st_mode)
      if not stat.S_ISREG(st.st_mode):
        problem = problem or f'{path} is not a regular file'
      elif st.st_uid != os.geteuid():
        problem = problem or (f'{path} belongs to {_owner(st.st_uid)}, not to this user '
                              f'({_owner(os.geteuid())})')
      elif mode & 0o077:
        problem = problem or f'{path} has mode {mode:04o}: others can read it (want 0600)'
  return problem


def _set_state(target: str, hosts: List[str], required_s: float) -> str | None:
  """None: `target` holds a usable set for `hosts`; `_MISSING`; or why it no longer
  covers the run (it ends sooner than `required_s` from now). Raises TunnelError when
  it is not this user's alone, or not a whole set of these hosts."""
  from cryptography.exceptions import InvalidSignature  # pylint: disable=g-import-not-at-top
  if not os.path.lexists(target):
    return _MISSING
  problem = _tree_problem(target)
  if problem:
    raise TunnelError(f'refusing the run\'s TLS credentials: {problem}')
  remove = f'remove {target} (with every host of the run stopped) to make new ones'
  try:
    with open(os.path.join(target, SET_HOSTS)) as f:
      made_for = json.load(f)['hosts']
    if made_for != hosts:
      raise TunnelError(f'the run\'s TLS credentials in {target} were made for the hosts '
                        f'{made_for}, not the cluster spec\'s {hosts}: {remove}')
    ca = load_cert(os.path.join(target, CA_CERT))
    leaves = [load_cert(os.path.join(target, HOSTS_DIR, h, CERT)) for h in hosts]
    for h in hosts:
      os.stat(os.path.join(target, HOSTS_DIR, h, KEY))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise TunnelError(f'the run\'s TLS credentials in {target} are incomplete or '
                      f'unreadable ({e}): {remove}') from None
  for host, leaf in zip(hosts, leaves):
    try:
      leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
      raise TunnelError(f'the certificate of {host} in {target} is not of its CA: '
                        f'{remove}') from None
  ends = min(c.not_valid_after_utc for c in (ca, *leaves))
  left = (ends - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
  if left < required_s:
    if left <= 0:
      return f'expired at {ends:%Y-%m-%d %H:%M} UTC'
    return (f'end at {ends:%Y-%m-%d %H:%M} UTC, before the run can end '
            f'({required_s / 3600:.1f} h from now)')
  return None


def _set_aside(target: str, root: str) -> None:
  """Removes the set `target`: renamed away first, so no host reads half of it."""
  aside = tempfile.mkdtemp(prefix='.old-', dir=root)
  try:
    os.rename(target, aside)  # replaces the empty `aside`
  except FileNotFoundError:
    pass
  shutil.rmtree(aside, ignore_errors=True)


def _make_set(root: str, target: str, hosts: List[str], run_name: str,
              lifetime_s: float) -> None:
  """The one-shot signer: a CA in memory issues every host's leaf, the set is written
  aside and renamed to `target` (a host that loses the race uses the winner's), and
  the CA key goes with this frame, never written."""
  ca_key, ca_cert = _new_ca(run_name, lifetime_s)
  leaves = {h: _new_leaf(ca_key, ca_cert, h, run_name, lifetime_s) for h in hosts}
  del ca_key
  staging = tempfile.mkdtemp(prefix='.tls-', dir=root)  # 0700
  try:
    _write(os.path.join(staging, SET_HOSTS), json.dumps({'hosts': hosts}).encode())
    _write(os.path.join(staging, CA_CERT), _pem_cert(ca_cert))
    os.mkdir(os.path.join(staging, HOSTS_DIR), 0o700)
    for host, (key_pem, cert_pem) in leaves.items():
      os.mkdir(os.path.join(staging, HOSTS_DIR, host), 0o700)
      _write(os.path.join(staging, HOSTS_DIR, host, KEY), key_pem)
      _write(os.path.join(staging, HOSTS_DIR, host, CERT), cert_pem)
    os.rename(staging, target)
    staging = None
  except OSError as e:
    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
      raise
  finally:
    if staging is not None:
      shutil.rmtree(staging, ignore_errors=True)


def ensure_run_credentials(tls_root: str, hosts: Sequence[str], run_name: str,
                           needed_s: float | None = None, replace: bool = False) -> str:
  """The directory of the run's set for `hosts` (every host of the cluster spec) under
  `tls_root`, made by whichever host comes first (`_make_set`) or reused.

  `tls_root` and everything under it must be this user's, directories 0700 and files
  0600, or TunnelError names the path and its owner. `needed_s`: the run's time budget
  still to run (None: no time budget); a new set lives that plus `MARGIN_S`, and one
  that ends sooner than it (at least `MIN_LEFT_S`) is renewed by the host that runs the
  central node (`replace`) while the others wait for it (`WAIT_FOR_CENTRAL_S`): one
  host replaces, so the hosts never split between two sets.
  """
  hosts = sorted({_check_host(h) for h in hosts})
  try:
    root = owned_paths.private_dir(tls_root, purpose='run\'s TLS directory')
  except owned_paths.UnsafePathError as e:
    raise TunnelError(str(e)) from None
  for legacy in (CA_KEY, CA_CERT):  # an earlier version's CA, key included: not used
    if os.path.lexists(os.path.join(root, legacy)):
      os.remove(os.path.join(root, legacy))
      print(f'tls_tunnel: removed {legacy} an earlier version left in {root}',
            file=sys.stderr, flush=True)
  target = run_credentials_dir(root, hosts)
  required_s = min(max(needed_s or 0.0, MIN_LEFT_S), MAX_LIFETIME_S - MARGIN_S)
  deadline, said, made = time.monotonic() + WAIT_FOR_CENTRAL_S, False, False
  while True:
    state = _set_state(target, hosts, required_s)
    if state is None:
      return target
    if made:
      raise TunnelError(f'the run\'s TLS credentials made in {target}: {state}')
    if state != _MISSING:
      if not replace:
        if time.monotonic() >= deadline:
          raise TunnelError(
              f'the run\'s TLS credentials in {target} {state}, and the host of the '
              f'central node (learner/0) did not renew them in {WAIT_FOR_CENTRAL_S:.0f} '
              f's: start it, or remove {target} with every host of the run stopped')
        if not said:
          print(f'tls_tunnel: the run\'s TLS credentials in {target} {state}; waiting '
                'for the host of the central node (learner/0) to renew them',
                file=sys.stderr, flush=True)
          said = True
        time.sleep(1.0)
        continue
      print(f'tls_tunnel: renewing the run\'s TLS credentials in {target}: they {state}',
            file=sys.stderr, flush=True)
      _set_aside(target, root)
    _make_set(root, target, hosts, run_name, _lifetime(needed_s))
    made = True


def remove_run_credentials(tls_root: str, hosts: Sequence[str]) -> bool:
  """Removes the run's set for `hosts` (the run ended), and what a host that died while
  making or removing one left (`.tls-*`, `.old-*`, an hour old); whether there was one."""
  for name in os.listdir(tls_root) if os.path.isdir(tls_root) else ():
    path = os.path.join(tls_root, name)
    if name.startswith(('.tls-', '.old-')) and time.time() - os.lstat(path).st_mtime > 3600:
      shutil.rmtree(path, ignore_errors=True)
  target = run_credentials_dir(tls_root, [_check_host(h) for h in hosts])
  if not os.path.lexists(target):
    return False
  _set_aside(target, tls_root)
  return True


# A job's credentials (a Vertex job: `seedacme.wire.replica_guard`): issued at submission
# by the launcher, one leaf per replica slot (`slot_name`), in a store the job's replicas
# read and no one else should: `<store>/ca.pem`, `<store>/<pool>-<index>.{cert,key}.pem`.
# A store is a local directory (0700, files 0600: the emulation) or a gs:// prefix
# (readable by who can read that bucket: the job's service account, and the user).


def _store_write(path: str, data: bytes) -> None:
  if '://' in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(path, 'wb') as f:
      f.write(data)
  else:
    _write(path, data)


def _store_read(path: str) -> bytes:
  if '://' in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()
  with open(path, 'rb') as f:
    return f.read()


def issue_slot_credentials(store: str, replicas: Dict[str, int], run_name: str,
                           needed_s: float | None = None) -> None:
  """The job's CA (in memory; its key is never written) and a leaf per replica slot
  (`replicas`: pool -> count) into `store`, which must not exist yet (a local one is
  made 0700). Leaves live the run's time budget (`needed_s`) plus `MARGIN_S`."""
  lifetime = _lifetime(needed_s)
  ca_key, ca_cert = _new_ca(run_name, lifetime)
  if '://' not in store:
    try:
      os.mkdir(store, 0o700)
    except FileExistsError:
      raise TunnelError(f'the job\'s credential store {store} exists already') from None
  _store_write(f'{store}/{CA_CERT}', _pem_cert(ca_cert))
  for pool, count in replicas.items():
    for index in range(count):
      key_pem, cert_pem = _new_slot_leaf(ca_key, ca_cert, slot_name(pool, index),
                                         run_name, lifetime)
      _store_write(f'{store}/{pool}-{index}.{KEY}', key_pem)
      _store_write(f'{store}/{pool}-{index}.{CERT}', cert_pem)


def fetch_slot_credentials(store: str, pool: str, index: int, work_dir: str
                           ) -> 'Credentials':
  """This replica's credentials from the job's `store`, into `work_dir` (private). A
  local store must be this user's alone (`_tree_problem`)."""
  problem = None if '://' in store else _tree_problem(store)
  if problem:
    raise TunnelError(f'replica {pool}/{index} cannot use the job\'s credentials: {problem}')
  made = []
  for name, saved_as in ((CA_CERT, CA_CERT), (f'{pool}-{index}.{CERT}', CERT),
                         (f'{pool}-{index}.{KEY}', KEY)):
    try:
      data = _store_read(f'{store}/{name}')
    except Exception as e:  # pylint: disable=broad-except  (OSError; tf.errors from a bucket)
      raise TunnelError(f'replica {pool}/{index} cannot read its credentials '
                        f'{store}/{name}: {type(e).__name__}: {e}') from None
    made.append(os.path.join(work_dir, saved_as))
    _write(made[-1], data)
  return Credentials(*made)


def remove_slot_credentials(store: str) -> bool:
  """Removes the job's store (the run ended); whether there was one."""
  if '://' in store:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if not tf.io.gfile.exists(store):
      return False
    tf.io.gfile.rmtree(store)
    return True
  if not os.path.isdir(store):
    return False
  shutil.rmtree(store, ignore_errors=True)
  return True


def _new_slot_leaf(ca_key, ca_cert, name: str, run_name: str, lifetime_s: float
                   ) -> Tuple[bytes, bytes]:
  """(key PEM, certificate PEM) naming one replica slot (a DNS SAN, no address)."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  return _sign_leaf(ca_key, ca_cert, [x509.DNSName(name)], f'seedacme {run_name} {name}',
                    lifetime_s)


class Credentials(NamedTuple):
  ca: str    # the run's CA certificate: the only trust root
  cert: str  # this host's certificate
  key: str


def _own_address_problem(address: str, cert_path: str) -> str | None:
  """Why peers would refuse this host's certificate: its name resolves here to an
  address the certificate does not name (it dials from there). None: fine."""
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  if _is_ip(address):
    return None
  try:
    alt = load_cert(cert_path).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)]
  except x509.ExtensionNotFound:
    ips = []
  named = {_ip(ip) for ip in ips}
  stray = [a for a in resolve_host(address) if _ip(a) not in named]
  if not stray:
    return None
  return (f'{address} resolves here to {", ".join(stray)}, which its certificate '
          f'({cert_path}) does not name ({", ".join(ips)}): the run\'s hosts must resolve '
          'the spec\'s names alike; if its addresses changed, remove '
          f'{os.path.dirname(os.path.dirname(os.path.dirname(cert_path)))} with every '
          'host of the run stopped')


def host_credentials(logdir: str, tls_dir: str | None, address: str, run_name: str,
                     work_dir: str, hosts: Sequence[str] = (),
                     needed_s: float | None = None, central: bool = False) -> Credentials:
  """This host's credentials: the user's own (`tls_dir`: its `cert.pem`/`key.pem`, or a
  leaf issued into `work_dir`, a private temp dir, from its `ca.key`), or its leaf of
  the run's set in `<logdir>/tls` (`ensure_run_credentials` for `hosts`, every host of
  the cluster spec; `address` is added). `needed_s`: the run's time budget still to
  run (None: none); `central`: this host runs the central node (it renews a set)."""
  if tls_dir:
    ca = os.path.join(tls_dir, CA_CERT)
    if not os.path.isfile(ca):
      raise TunnelError(f'--tls_dir {tls_dir} has no {CA_CERT}')
    if os.path.isfile(os.path.join(tls_dir, CERT)) and os.path.isfile(os.path.join(tls_dir, KEY)):
      return Credentials(ca, os.path.join(tls_dir, CERT), os.path.join(tls_dir, KEY))
    if not os.path.isfile(os.path.join(tls_dir, CA_KEY)):
      raise TunnelError(f'--tls_dir {tls_dir} needs this host\'s {CERT} and {KEY}, or '
                        f'{CA_KEY} to issue them from')
    return Credentials(ca, *issue_leaf(tls_dir, address, work_dir, run_name,
                                       _lifetime(needed_s)))
  if '://' in logdir:
    raise TunnelError(f'the logdir {logdir} is a bucket: keys are not written there; '
                      'give every host --tls_dir (ca.pem and its own cert.pem/key.pem)')
  run_dir = ensure_run_credentials(os.path.join(logdir, TLS_DIR), [*hosts, address],
                                   run_name, needed_s, replace=central)
  leaf = os.path.join(run_dir, HOSTS_DIR, address)
  creds = Credentials(os.path.join(run_dir, CA_CERT), os.path.join(leaf, CERT),
                      os.path.join(leaf, KEY))
  problem = _own_address_problem(address, creds.cert)
  if problem:
    raise TunnelError(problem)
  return creds


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
  `outbound` (alias port in the namespace -> remote host, port).

  With replica identities (`slot_plan`: a Vertex job, whose hosts are named only once
  it runs), `slots` maps each replica's certificate name (`slot_name`) to its spec host,
  and `server_names` an alias port to the name the remote's certificate must carry;
  `loopback` is where this host's replicas listen (127.0.0.1 but in the Vertex
  emulation, which gives each emulated container an address of its own)."""
  address: str
  inbound: List[int]
  outbound: Dict[int, Tuple[str, int]]
  slots: Dict[str, str] = {}
  server_names: Dict[int, str] = {}
  loopback: str = '127.0.0.1'


def _split(address: str) -> Tuple[str, int]:
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def plan(spec: Dict[str, List[str]], mine: Sequence[Tuple[str, int]],
         loopback: str = '127.0.0.1') -> Tuple[Plan, Dict[str, List[str]]]:
  """This host's `Plan` and the cluster spec its replicas see (own replicas on
  `loopback` at their ports; others at alias ports). Raises TunnelError when this
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
        local[pool].append(f'{loopback}:{port}')
        continue
      if (host, port) not in by_remote:
        alias = port
        while alias in used:
          alias = 20000 + (alias * 7919) % 40000
        used.add(alias)
        by_remote[(host, port)] = alias
        outbound[alias] = (host, port)
      local[pool].append(f'{loopback}:{by_remote[(host, port)]}')
  return Plan(address, sorted(own_ports), outbound, loopback=loopback), local


SLOT_DOMAIN = 'replica.seedacme.invalid'  # never resolves: a name, not an address


def slot_name(pool: str, index: int) -> str:
  """The certificate name of replica `index` of `pool` (a Vertex job's identity: its
  hosts are named only at run time, so leaves issued at submission name the slot)."""
  return f'{pool}-{index}.{SLOT_DOMAIN}'


def slot_plan(spec: Dict[str, List[str]], me: Tuple[str, int],
              loopback: str = '127.0.0.1') -> Tuple[Plan, Dict[str, List[str]]]:
  """`plan` for one replica of a job whose leaves name slots (`issue_slot_credentials`):
  the remote certificate a dial expects is the remote replica's slot, and a peer's
  slot is checked against the addresses its spec host resolves to (`address_problem`).
  Raises TunnelError when two replicas share an address and port."""
  base, local = plan(spec, [me], loopback)
  slots, at = {}, {}
  for pool, addresses in spec.items():
    for i, entry in enumerate(addresses):
      host, port = _split(entry)
      if (host, port) in at:
        raise TunnelError(f'the cluster spec gives {entry} to {at[(host, port)]} and '
                          f'{pool}/{i}')
      at[(host, port)] = f'{pool}/{i}'
      slots[slot_name(pool, i)] = host
  names = {alias: slot_name(*at[remote].split('/')) for alias, remote in base.outbound.items()}
  return base._replace(slots=slots, server_names=names), local


# ---------------------------------------------------------------------------------------
# The keeper: lives in the private namespace, makes sockets there on request


def _loopback_socket(verb: str, port: int, address: str = '127.0.0.1') -> socket.socket:
  """A socket on `address` (loopback) of this process's namespace: listening on
  `port` ('listen') or connected to it (otherwise, within 5 s)."""
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    if verb == 'listen':
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      sock.bind((address, port))
      sock.listen(128)
    else:
      sock.settimeout(5)
      sock.connect((address, port))
      sock.settimeout(None)
  except OSError:
    sock.close()
    raise
  return sock


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
      try:
        sock = _loopback_socket(verb, int(port))
      except OSError as e:
        control.sendall(f'error {e.strerror or e}\n'.encode())
        continue
      try:
        socket.send_fds(control, [b'ok\n'], [sock.fileno()])
      finally:
        sock.close()


class _LoopbackKeeper:
  """Where no namespace can be made (issue 64): the replicas' servers are on this host's
  loopback (`seedacme.runtime.isolation`), so the tunnel makes its sockets there
  itself; its alias listeners, on a loopback every local user shares, admit only this
  uid (`_serve`'s outbound handler)."""
  shared_loopback = True

  def __init__(self, address: str = '127.0.0.1'):
    self.address = address

  def socket(self, verb: str, port: int) -> socket.socket:
    try:
      return _loopback_socket(verb, port, self.address)
    except OSError as e:
      raise OSError(f'{verb} {self.address}:{port} on loopback: {e.strerror or e}') from e


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


class RateLog:
  """Lines to stderr, bounded three ways so that no scan or flood can fill the
  launcher's log or this process's memory: a key (a peer and port, an error's kind) is
  said at most once per `every_s`, its next line counting those unsaid since; at most
  `per_minute` lines a minute in all (the next says how many were dropped); at most
  `max_keys` keys remembered, the least recently said forgotten first."""

  def __init__(self, every_s: float = 60.0, per_minute: int = 30, max_keys: int = 1024,
               clock=time.monotonic, stream=None):
    self._every_s, self._per_minute, self._max_keys = every_s, per_minute, max_keys
    self._clock, self._stream = clock, stream
    self._keys: Dict[str, List] = {}  # key -> [said at, unsaid since]; oldest first
    self._minute, self._in_minute, self._dropped = float('-inf'), 0, 0
    self._lock = threading.Lock()  # the tunnels of one process share it
    self.lines = 0

  def say(self, key: str, line: str) -> bool:
    """Writes `line` unless a bound says no; whether it did."""
    with self._lock:
      now = self._clock()
      entry = self._keys.get(key)
      if entry is not None and now - entry[0] < self._every_s:
        entry[1] += 1
        return False
      if now - self._minute >= 60.0:
        self._minute, self._in_minute = now, 0
      if self._in_minute >= self._per_minute:
        self._dropped += 1
        return False
      self._in_minute += 1
      notes = []
      if entry is not None and entry[1]:
        notes.append(f'{entry[1]} more like it in the last {now - entry[0]:.0f}s')
      if self._dropped:
        notes.append(f'{self._dropped} other lines unsaid: over {self._per_minute} a '
                     'minute')
        self._dropped = 0
      self._keys.pop(key, None)
      self._keys[key] = [now, 0]
      while len(self._keys) > self._max_keys:
        del self._keys[next(iter(self._keys))]
      self.lines += 1
    print(f'tls_tunnel: {line}' + (f' [{"; ".join(notes)}]' if notes else ''),
          file=self._stream or sys.stderr, flush=True)
    return True


_LOG = RateLog()


def _say(line: str, key: str | None = None) -> None:
  """Logs `line` at a bounded rate (`RateLog`): once a minute per `key` (default:
  the line up to ' at ', its peer and port). The counters count every refusal."""
  _LOG.say(key or line.split(' at ')[0], line)


# Why a connection was refused (`Counters.refused_by`): before its handshake, over a
# budget of `Admission`; at it, its deadline passed, its certificate (none, or not of
# the run's CA), anything else that broke the handshake (junk, a reset), or a leaf of
# the run used from an address it does not name (`address_problem`).
REFUSALS = ('over_total', 'over_source', 'over_rate', 'handshake_timeout',
            'bad_certificate', 'handshake_failed', 'address_mismatch', 'local_uid')


class Counters:
  """What the endpoint saw: connections to its TLS ports, refused (by reason,
  `REFUSALS`) and accepted (a handshake of the run's), bytes forwarded after a
  handshake, strangers shunned (their SYNs then dropped in the kernel, not counted),
  failed accept()s and other errors of the event loop, and the most handshakes in
  progress at once. The accepting thread and the relay's both count."""

  def __init__(self):
    self.connections = self.refused = self.accepted = self.forwarded = 0
    self.accept_errors = self.loop_errors = self.pending_peak = self.shunned = 0
    self.refused_by = dict.fromkeys(REFUSALS, 0)
    self._lock = threading.Lock()

  def refuse(self, reason: str) -> None:
    with self._lock:
      self.refused += 1
      self.refused_by[reason] += 1

  def add(self, name: str, n: int = 1) -> None:
    with self._lock:
      setattr(self, name, getattr(self, name) + n)

  def as_dict(self) -> Dict[str, int]:
    return dict(connections=self.connections, refused=self.refused,
                accepted=self.accepted, forwarded=self.forwarded,
                **{f'refused_{reason}': n for reason, n in self.refused_by.items()},
                shunned=self.shunned, accept_errors=self.accept_errors,
                loop_errors=self.loop_errors, pending_peak=self.pending_peak)


# ---- Admission before the handshake
#
# Until its handshake ends a connection costs the endpoint a descriptor, a task and
# (with a ClientHello) the server's share of the handshake's crypto; unbounded, three
# stranger processes took it to its 1,024 descriptors and the run's own peer timed out
# (issue 62). So a connection starts a handshake only within a budget: each of the
# run's other hosts (the spec's addresses, names resolved) has one of its own that no
# one else draws on; every other address shares one, per address and in total, and
# per address and in total in rate. Over a budget it is reset at once, before a byte
# of it is read, and a stranger that keeps coming over its rate is shunned: a socket
# filter on the listeners drops its packets in the kernel for a while, so its flood
# costs the endpoint nothing more. A stranger on one of the run's hosts shares that
# host's address, so its budget: nothing tells them apart before a certificate.


class Limits(NamedTuple):
  """The endpoint's admission budgets (`Admission`) and handshake deadline."""
  # Accept to a finished handshake: a stranger that sends nothing holds its place this
  # long. The run's peers, during a flood on 2 cores, took at most 0.18 s at load 2
  # and 1.8 s at load 12-17 (tests/unit/test_tls_flood.py); their own budget is what
  # keeps them in, so they get a deadline that a loaded machine cannot miss.
  handshake_s: float = 3.0
  peer_handshake_s: float = 10.0
  peer_per_source: int = 64       # handshakes at once from one of the run's hosts
  stranger_total: int = 256       # ... from every other address together
  stranger_per_source: int = 16   # ... from one other address
  stranger_rate: float = 20.0     # handshakes begun a second, per other address
  stranger_burst: int = 40        # ... at once after a quiet spell
  stranger_total_rate: float = 200.0  # ... every other address together
  # A stranger still over its rate after this many refusals in a row is shunned: the
  # kernel drops its SYNs (`shun_filter`) for `shun_s`, doubling each time (to 10 min).
  shun_after: int = 40
  shun_s: float = 30.0
  max_shunned: int = 1024
  backlog: int = 1024             # the kernel's queue of connections not yet accepted


LIMITS = Limits()
MAX_SOURCES = 4096  # strangers whose rate is remembered (the least recent forgotten)


def _source(peer: str) -> str:
  """An address as the budgets count it: an IPv4 one seen through an IPv6 socket as
  itself, no scope."""
  if ':' not in peer:  # IPv4 as accept() gives it: the flood's path, kept short
    return peer
  try:
    address = ipaddress.ip_address(peer.split('%')[0])
  except ValueError:
    return peer
  if address.version == 6 and address.ipv4_mapped is not None:
    address = address.ipv4_mapped
  return str(address)


def peer_addresses(plan_: Plan) -> Tuple[frozenset, List[str]]:
  """The addresses the run's other hosts connect from (the hosts this one dials: every
  other host of the spec; a name resolved to all its addresses), and the names that
  did not resolve."""
  found, unresolved = set(), []
  for host in sorted({h for h, _ in plan_.outbound.values()}):
    try:
      ipaddress.ip_address(host.split('%')[0])
      found.add(_source(host))
      continue
    except ValueError:
      pass
    try:
      found.update(_source(info[4][0]) for info in
                   socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except OSError:
      unresolved.append(host)
  return frozenset(found), unresolved


def _refill(bucket: Tuple[float, float] | None, now: float, rate: float,
            burst: float) -> float:
  """A token bucket's tokens at `now` (`bucket`: tokens, when; None: a full one)."""
  if bucket is None:
    return float(burst)
  return min(float(burst), bucket[0] + (now - bucket[1]) * rate)


class Admission:
  """Who may start a handshake now (`Limits`, the section's comment): `admit` says
  why not (a `REFUSALS` reason) or None, and then counts the connection as in
  handshake until `release` (the accepting thread admits, the relay's releases)."""

  def __init__(self, peers: frozenset, limits: Limits, clock=time.monotonic):
    self.peers, self.limits, self._clock = peers, limits, clock
    self.pending: Dict[str, int] = {}  # address -> handshakes in progress from it
    self.strangers = 0                 # of those, from addresses not the run's
    self._rate: Dict[str, Tuple[float, float]] = {}  # stranger -> (tokens, when)
    self._total_rate: Tuple[float, float] | None = None
    self._over: Dict[str, int] = {}  # stranger -> over-rate refusals in a row
    self.shunned: Dict[str, float] = {}  # stranger -> until when
    self._shunned_before: Dict[str, int] = {}  # stranger -> times (bounded as _rate)
    self.version = 0  # of `shunned`: one more at each change
    self.shun_count = 0  # addresses shunned, in all
    self._lock = threading.Lock()

  def admit(self, source: str) -> str | None:
    with self._lock:
      return self._admit(source)

  def _admit(self, source: str) -> str | None:
    limits, held = self.limits, self.pending.get(source, 0)
    if source in self.peers:
      if held >= limits.peer_per_source:
        return 'over_source'
      self.pending[source] = held + 1
      return None
    if source in self.shunned:  # queued before its SYNs were dropped
      return 'over_rate'
    # Rate first: every attempt counts, whatever else refuses it (a stranger holding
    # its places and connecting on is shunned as soon as one flooding briefly).
    now = self._clock()
    mine = _refill(self._rate.pop(source, None), now, limits.stranger_rate,
                   limits.stranger_burst)
    everyone = _refill(self._total_rate, now, limits.stranger_total_rate,
                       2 * limits.stranger_total_rate)
    taken = 1.0 if mine >= 1.0 and everyone >= 1.0 else 0.0
    self._rate[source] = (mine - taken, now)  # re-inserted: the most recent last
    self._total_rate = (everyone - taken, now)
    if len(self._rate) > MAX_SOURCES:  # forget the least recent quarter
      for key in list(itertools.islice(self._rate, len(self._rate) // 4)):
        for state in (self._rate, self._over, self._shunned_before):
          state.pop(key, None)
    if mine < 1.0:  # over its own rate: in a row long enough, shunned
      self._over[source] = over = self._over.get(source, 0) + 1
      if over >= limits.shun_after and len(self.shunned) < limits.max_shunned:
        self._shun(source, now)
      return 'over_rate'
    self._over.pop(source, None)
    if everyone < 1.0:
      return 'over_rate'
    if self.strangers >= limits.stranger_total:
      return 'over_total'
    if held >= limits.stranger_per_source:
      return 'over_source'
    self.strangers += 1
    self.pending[source] = held + 1
    return None

  def _shun(self, source: str, now: float) -> None:
    times = self._shunned_before.get(source, 0)
    self._shunned_before[source] = times + 1
    self.shunned[source] = now + min(600.0, self.limits.shun_s * 2 ** times)
    self._over.pop(source, None)
    self.version += 1
    self.shun_count += 1

  def shunning(self) -> Tuple[int, Dict[str, float], int]:
    """(version, address -> seconds left, addresses shunned in all), as of now."""
    with self._lock:
      now = self._clock()
      return (self.version, {a: until - now for a, until in self.shunned.items()},
              self.shun_count)

  def expire(self) -> None:
    """Ends the shunning of addresses whose time is up."""
    with self._lock:
      now = self._clock()
      done = [a for a, until in self.shunned.items() if until <= now]
      for address in done:
        del self.shunned[address]
      if done:
        self.version += 1

  def release(self, source: str) -> None:
    with self._lock:
      held = self.pending.pop(source) - 1
      if held:
        self.pending[source] = held
      if source not in self.peers:
        self.strangers -= 1

  @property
  def in_handshake(self) -> int:
    with self._lock:
      return sum(self.pending.values())


def _raise_descriptor_limit() -> int:
  """Raises this process's soft RLIMIT_NOFILE to its hard limit (the relay's
  connections and the handshakes in progress are descriptors); the soft limit now."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
  if soft == resource.RLIM_INFINITY or soft >= want:
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
  try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
  except (ValueError, OSError):
    return soft
  return want


def exception_handler(counters: Counters):
  """The event loop's handler for what no task catches. asyncio reports a failed
  accept() of a `start_server` listener (the alias ports) there with its traceback,
  each time: 15,607 of them in 30 s of a flood (issue 62). Here each is counted and
  said at a bounded rate, by kind, without the traceback."""
  def handle(loop, context):  # pylint: disable=unused-argument
    error = context.get('exception')
    message = context.get('message') or 'error in the event loop'
    counters.add('accept_errors' if 'accept' in message else 'loop_errors')
    kind = getattr(error, 'errno', None)
    kind = errno.errorcode.get(kind, type(error).__name__) if error is not None else ''
    _say(f'{message}: {kind} {error or ""}'.rstrip(), key=f'loop {message} {kind}')
  return handle


_SO_ATTACH_FILTER, _SO_DETACH_FILTER = 26, 27  # Linux; the socket module lacks them
_SKF_NET_OFF = -0x100000  # a classic BPF load's offset from the network header


def shun_filter(sock: socket.socket, addresses) -> None:
  """Sets a classic BPF filter on the listening socket `sock` that drops every packet
  from `addresses` (its family's) in the kernel, SYNs included: a shunned stranger's
  connect() waits out its retransmissions instead of costing the endpoint an accept()
  each. None: no filter. Raises OSError where filters are unavailable."""
  import ctypes  # pylint: disable=g-import-not-at-top
  v6 = sock.family == socket.AF_INET6
  words = []
  for address in addresses:
    ip = ipaddress.ip_address(address)
    if (ip.version == 6) == v6:
      words.append(struct.unpack('!4I', ip.packed) if v6 else struct.unpack('!I', ip.packed))
  words = words[:4095 // (2 * (4 if v6 else 1) + 1)]  # BPF_MAXINSNS: 4,096
  if not words:
    try:
      sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
    except OSError as e:
      if e.errno != errno.ENOENT:  # none attached
        raise
    return
  offset = _SKF_NET_OFF + (8 if v6 else 12)  # the source address in the IP header
  program = []  # (code, jump if true, jump if false, k)
  for address in words:
    # Per address: load a word of the source, compare; any mismatch skips to the next
    # address; all equal: drop (return 0).
    left = 2 * len(address)
    for i, word in enumerate(address):
      left -= 2
      program.append((0x20, 0, 0, (offset + 4 * i) & 0xffffffff))  # ld [net + k]
      program.append((0x15, 0, left + 1, word))                     # jeq #word
    program.append((0x06, 0, 0, 0))                                  # ret #0: drop
  program.append((0x06, 0, 0, 0xffffffff))                           # ret: keep
  code = ctypes.create_string_buffer(b''.join(struct.pack('HBBI', *i) for i in program))
  sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER,
                  struct.pack('HxxxxxxQ', len(program), ctypes.addressof(code)))


def _reset(conn: socket.socket) -> None:
  """Closes `conn` at once with a reset (no FIN handshake, no TIME_WAIT here)."""
  try:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
  except OSError:
    pass
  conn.close()


def _listeners(address: str, port: int, backlog: int) -> List[socket.socket]:
  """Non-blocking listening sockets at `port` on what `address` resolves to (as
  `asyncio.start_server` binds)."""
  made = []
  try:
    infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    for family, kind, proto, _, where in dict.fromkeys(infos):
      sock = socket.socket(family, kind, proto)
      made.append(sock)
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
      sock.bind(where)
      sock.listen(backlog)
      sock.setblocking(False)
  except BaseException:
    for sock in made:
      sock.close()
    raise
  return made


def _accept_loop(listening: Dict[socket.socket, int], admission: Admission,
                 counters: Counters, hand_over, stop: threading.Event) -> None:
  """accept() on the endpoint's ports (`listening`: socket -> port) until `stop`, in
  a thread of its own, so that the relay's event loop (the run's bytes) never waits
  behind a flood's connections: taken there, 2,500 a second from a stranger host cut
  the run's cross-host acting to 0.31 of its rate (a sink taking as many in another
  process: 0.85; in this thread, unshunned: 0.53, shunned: 0.80; all
  tests/integration/test_tls_flood.py). A connection over a budget is reset here;
  one admitted goes to `hand_over(conn, peer, port)` for its handshake. A failed
  accept() is counted and said at a bounded rate; a shortage of descriptors or memory
  is waited out (the connection stays in the kernel's queue)."""
  shunning = 0  # the version of `admission.shunned` the filters have
  with selectors.DefaultSelector() as selector:
    for sock, port in listening.items():
      selector.register(sock, selectors.EVENT_READ, port)
    while not stop.is_set():
      admission.expire()
      if admission.version != shunning:
        shunning = _apply_shunning(listening, admission, counters)
      for key, _ in selector.select(0.2):
        sock, port = key.fileobj, key.data
        for _ in range(64):  # then the other ports' turn
          try:
            conn, address = sock.accept()
          except (BlockingIOError, InterruptedError):
            break
          except OSError as e:
            counters.add('accept_errors')
            kind = errno.errorcode.get(e.errno, type(e).__name__)
            _say(f'accept() on port {port} failed: {kind} {e.strerror or e} (the '
                 'connection waits in the kernel\'s queue)', key=f'accept {kind}')
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
              stop.wait(0.05)  # rather than spin on it
              break
            continue
          counters.connections += 1  # counted in this thread only
          peer = address[0]
          reason = admission.admit(_source(peer))
          if reason is not None:
            counters.refuse(reason)
            _reset(conn)
            _say(f'refused {peer} on port {port} before the handshake ({reason})',
                 key=f'refused {peer} on port {port}')
            continue
          counters.pending_peak = max(counters.pending_peak, admission.in_handshake)
          if shunning:  # the listener's filter came with it: not needed past accept
            try:
              conn.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
            except OSError:
              pass
          conn.setblocking(False)
          try:
            hand_over(conn, peer, port)
          except RuntimeError:  # the loop closed: the endpoint is going
            admission.release(_source(peer))
            conn.close()
            return


def _apply_shunning(listening: Dict[socket.socket, int], admission: Admission,
                    counters: Counters) -> int:
  """The listening sockets' filters made to drop what `admission` shuns now; the
  version of it done. Where the kernel takes no filter, said (the refusals go on
  here, one connection at a time)."""
  version, shunned, times = admission.shunning()
  counters.shunned = times
  try:
    for sock in listening:
      shun_filter(sock, list(shunned))
  except OSError as e:
    _say(f'cannot shun strangers in the kernel ({e}): their connections are refused '
         'one at a time', key='shun filter')
    return version
  for address, left in shunned.items():
    _say(f'shunning {address} for {left:.0f}s: over its rate of connections '
         'after its refusals; its SYNs are dropped in the kernel (not counted)',
         key=f'shun {address}')
  return version


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


async def _handshake(conn: socket.socket, ctx: ssl.SSLContext, deadline_s: float):
  """The server side of TLS on an accepted socket, within `deadline_s`: (reader,
  writer) on the TLS transport. Raises asyncio.TimeoutError past the deadline,
  ssl.SSLError or OSError when the handshake fails (the socket closed)."""
  loop = asyncio.get_running_loop()
  reader = asyncio.StreamReader(limit=_CHUNK)
  protocol = asyncio.StreamReaderProtocol(reader)
  try:
    transport, _ = await asyncio.wait_for(loop.connect_accepted_socket(
        lambda: protocol, conn, ssl=ctx, ssl_handshake_timeout=deadline_s + 5),
        deadline_s)
  except BaseException:
    conn.close()  # closed already where the transport was made (a no-op then)
    raise
  return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _certificate_problem(error: ssl.SSLError) -> bool:
  """Whether a failed handshake was about the peer's certificate (none, or not of
  the run's CA), rather than junk or a connection cut short."""
  return isinstance(error, ssl.SSLCertVerificationError) or \
      'CERTIFICATE' in (getattr(error, 'reason', None) or '') or 'UNKNOWN_CA' in str(error)


def _sans(cert: Dict) -> Tuple[List[str], List[str]]:
  """(IP addresses, DNS names) a peer's certificate (`getpeercert()`) names."""
  alt = cert.get('subjectAltName', ())
  return ([v.strip() for k, v in alt if k == 'IP Address'], [v for k, v in alt if k == 'DNS'])


RESOLVED_TTL_S = 60.0
_resolved: Dict[str, Tuple[float, List[str]]] = {}


def _resolve_recent(name: str) -> List[str]:
  """`_resolve`, remembered for `RESOLVED_TTL_S` (at most 256 names)."""
  now = time.monotonic()
  hit = _resolved.get(name)
  if hit is None or now - hit[0] > RESOLVED_TTL_S:
    if len(_resolved) >= 256:
      _resolved.clear()
    hit = _resolved[name] = (now, resolve_host(name))
  return hit[1]


def address_problem(peer: str, cert: Dict, slots: Dict[str, str] | None = None
                    ) -> str | None:
  """Why a peer of the run is refused anyway: it connects from an address its
  certificate does not name (a leaf copied to another machine). None: it names it.

  A certificate with IP SANs (the run's own: a name's addresses as resolved when it was
  issued) is checked against them; one with DNS names only (a user's own `--tls_dir`
  leaf) against what they resolve to now (a lookup that blocks, remembered a minute,
  and only for a peer that showed a certificate of the run); one naming neither is
  refused. `slots` (a job's replica names -> their spec hosts, `slot_plan`): a slot
  name is checked against what its host resolves to now, and a certificate naming a
  slot of another job (not in `slots`) is refused.
  """
  ips, names = _sans(cert)
  if slots is not None and any(n.endswith('.' + SLOT_DOMAIN) for n in names):
    if ips or len(names) != 1 or names[0] not in slots:
      return f'its certificate names {", ".join(names)}: no replica of this job'
    host = slots[names[0]]
    names = [host]
    if _is_ip(host):
      ips, names = [host], []
  try:
    source = _ip(peer)
  except ValueError:
    return f'connects from an address that cannot be read ({peer!r})'
  if ips:
    if any(_ip(ip) == source for ip in ips):
      return None
    return f'connects from {source}, its certificate names {", ".join(ips)}'
  if names:
    resolved = sorted({a for name in names for a in _resolve_recent(name)})
    if any(_ip(a) == source for a in resolved):
      return None
    return (f'connects from {source}, its certificate names {", ".join(names)} '
            f'({", ".join(resolved) if resolved else "resolving to nothing"})')
  return 'its certificate names no address or host name'


async def _serve(plan_: Plan, keeper: _Keeper, server_ctx: ssl.SSLContext,
                 client_ctx: ssl.SSLContext, counters: Counters, ready,
                 limits: Limits = LIMITS) -> None:
  """The endpoint: the inbound ports accepted in a thread of their own
  (`_accept_loop`: admission before the handshake), the handshake of an admitted
  connection within its deadline, then the relay; and a listener in the namespace
  per outbound alias."""
  loop = asyncio.get_running_loop()
  loop.set_exception_handler(exception_handler(counters))
  peers, unresolved = await loop.run_in_executor(None, peer_addresses, plan_)
  if unresolved:
    _say(f'the run\'s hosts {", ".join(unresolved)} do not resolve: their connections '
         'share the budget of strangers', key='unresolved')
  admission = Admission(peers, limits)
  servers, listening, tasks, stop = [], {}, set(), threading.Event()
  acceptor = None

  async def inbound(conn: socket.socket, peer: str, port: int):
    source, reason = _source(peer), None
    deadline_s = limits.peer_handshake_s if source in peers else limits.handshake_s
    try:  # nothing is read from the peer but its handshake, and nothing forwarded
      here = await _handshake(conn, server_ctx, deadline_s)
      # Off the loop: with DNS names only, the check may resolve them (blocking).
      problem = await loop.run_in_executor(
          None, address_problem, peer, here[1].get_extra_info('peercert') or {},
          plan_.slots or None)
      if problem:
        reason = 'address_mismatch'
    except asyncio.TimeoutError:
      reason, problem = 'handshake_timeout', f'none within {deadline_s:g}s'
    except ssl.SSLError as e:
      reason = 'bad_certificate' if _certificate_problem(e) else 'handshake_failed'
      problem = f'{type(e).__name__}: {e}'
    except (OSError, ConnectionError) as e:
      reason, problem = 'handshake_failed', f'{type(e).__name__}: {e}'
    finally:
      admission.release(source)
    if reason is not None:
      counters.refuse(reason)
      _say(f'refused {peer} on port {port} at the handshake ({problem})')
      if reason == 'address_mismatch':
        here[1].transport.abort()
      return
    counters.accepted += 1
    try:
      inner = await loop.run_in_executor(None, keeper.socket, 'connect', port)
      there = await asyncio.open_connection(sock=inner)
    except OSError:
      here[1].close()
      return
    await _join(here, there, counters)

  def start(conn: socket.socket, peer: str, port: int) -> None:
    task = loop.create_task(inbound(conn, peer, port))
    tasks.add(task)  # the loop keeps only a weak reference
    task.add_done_callback(tasks.discard)

  def outbound(host, port, alias):
    async def handle(reader, writer):
      if getattr(keeper, 'shared_loopback', False):
        # The aliases listen on the host's loopback (no namespace here): only this
        # uid's processes (the replicas) may go through this host's certificate.
        sock = writer.get_extra_info('socket')
        uid = await loop.run_in_executor(None, isolation.peer_uid, sock)
        if uid is None:  # gone before it was looked up (a port probe): nothing to relay
          writer.transport.abort()
          return
        if uid != os.geteuid():
          counters.refuse('local_uid')
          _say(f'refused uid {uid} on alias port {sock.getsockname()[1]} (loopback: '
               'only this uid\'s replicas dial through the endpoint)', key='local_uid')
          writer.transport.abort()
          return
      try:
        there = await asyncio.wait_for(asyncio.open_connection(
            host, port, ssl=client_ctx,
            # the dialled host, or with a job's identities the remote replica's slot
            server_hostname=plan_.server_names.get(alias, host),
            local_addr=(plan_.address, 0),  # the address its certificate names
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S), HANDSHAKE_TIMEOUT_S + 5)
      except (OSError, asyncio.TimeoutError, ssl.SSLError):
        writer.close()
        return
      await _join((reader, writer), there, counters)
    return handle

  try:
    for port in plan_.inbound:
      for sock in _listeners(plan_.address, port, limits.backlog):
        listening[sock] = port
    acceptor = threading.Thread(
        target=_accept_loop, name='tls-accept', daemon=True,
        args=(listening, admission, counters,
              lambda *conn: loop.call_soon_threadsafe(start, *conn), stop))
    acceptor.start()
    for alias, (host, port) in plan_.outbound.items():
      listener = await loop.run_in_executor(None, keeper.socket, 'listen', alias)
      servers.append(await asyncio.start_server(outbound(host, port, alias), sock=listener))
    ready()
    await asyncio.Event().wait()  # until cancelled
  finally:
    stop.set()
    if acceptor is not None:
      acceptor.join(2)
    for sock in listening:
      sock.close()
    for server in servers:
      server.close()


# ---------------------------------------------------------------------------------------
# The tunnel as the launcher uses it


class Tunnel:
  """A private namespace for this host's replicas and, when other hosts take part, the
  TLS endpoint in front of it. `prefix` runs a command inside the namespace.

  `mechanism='loopback'` (a host without namespaces, `seedacme.runtime.isolation`): no
  namespace; the replicas run with the loopback interposer (`env`), the endpoint relays
  to their loopback ports, and its alias listeners admit only this uid."""

  def __init__(self, plan_: Plan | None, creds: Credentials | None,
               mechanism: str = 'namespace'):
    if mechanism not in ('namespace', 'loopback'):
      raise ValueError(f"mechanism must be 'namespace' or 'loopback', got {mechanism!r}")
    self.plan, self.counters, self.mechanism = plan_, Counters(), mechanism
    self._loop: asyncio.AbstractEventLoop | None = None
    self._thread = None
    self._keeper = None
    if mechanism == 'loopback':
      self.keeper = _LoopbackKeeper(plan_.loopback if plan_ is not None else '127.0.0.1')
    else:
      ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
      # The keeper: unshare makes the namespace, `ip` brings lo up, Python serves fds.
      self._keeper = subprocess.Popen(
          ['unshare', '-rn', '--', 'sh', '-c', 'ip link set lo up && exec "$0" "$@"',
           sys.executable, '-m', 'seedacme.wire.tls_tunnel', 'keeper',
           str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
      theirs.close()
      self.keeper = _Keeper(ours)
      try:
        self.keeper.socket('listen', 0).close()  # the namespace is up, lo included
      except OSError as e:
        self.close()
        raise TunnelError(f'the private namespace did not come up: {e}') from e
    if plan_ is not None and (plan_.inbound or plan_.outbound):
      self._start_relay(creds)

  @property
  def namespace_pid(self) -> int:
    if self._keeper is None:
      raise TunnelError('no namespace: this tunnel keeps the replicas on loopback')
    return self._keeper.pid

  def prefix(self) -> List[str]:
    """argv prefix that runs a command in the namespace (unprivileged: we own it);
    none on loopback."""
    if self._keeper is None:
      return []
    return ['nsenter', '-t', str(self._keeper.pid), '-U', '-n', '--preserve-credentials',
            '--']

  def env(self, base: Dict[str, str]) -> Dict[str, str]:
    """The environment a replica runs with: on loopback, the interposer preloaded (its
    wildcard binds moved to the plan's loopback address)."""
    if self.mechanism != 'loopback':
      return dict(base)
    env = isolation.loopback_env(base)
    if self.plan is not None and self.plan.loopback != '127.0.0.1':
      env[isolation.ADDRESS_ENV] = self.plan.loopback
    return env

  def _start_relay(self, creds: Credentials) -> None:
    server_ctx, client_ctx = contexts(creds)
    started, failed = threading.Event(), []
    # Every handshake in progress and every relayed connection is a descriptor: the
    # hard limit, and strangers' handshakes at most a quarter of it.
    descriptors = _raise_descriptor_limit()
    limits = LIMITS._replace(stranger_total=max(
        1, min(LIMITS.stranger_total, descriptors // 4)))

    def run():
      loop = self._loop = asyncio.new_event_loop()
      task = loop.create_task(_serve(self.plan, self.keeper, server_ctx, client_ctx,
                                     self.counters, started.set, limits))
      try:
        loop.run_until_complete(task)
      except asyncio.CancelledError:
        pass
      except BaseException as e:  # pylint: disable=broad-except
        failed.append(e)
        started.set()
      finally:
        # Handshakes and relays still open end here, before the loop closes (else
        # asyncio reports each as a task destroyed while pending).
        pending = asyncio.all_tasks(loop)
        for left in pending:
          left.cancel()
        if pending:
          loop.run_until_complete(asyncio.wait(pending, timeout=2))
        loop.run_until_complete(asyncio.sleep(0))  # their transports' last callbacks
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
    if self._keeper is not None and self._keeper.poll() is None:
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
