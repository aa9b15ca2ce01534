"""How a run keeps its servers off the network, and a check of what actually listens.

Courier 0.5 and Reverb 0.7 bind `[::]:port` in their C++ with no address argument, so
left alone every replica's servers are on every interface of the host, unauthenticated.
Two mechanisms keep them off it (issue 64), the stronger first:

- 'namespace': the replicas run in a private user+network namespace whose only
  interface is their own `lo` (`seedacme.wire.tls_tunnel.Tunnel`). Other users of the
  host cannot reach them at all.
- 'loopback': where no namespace can be made (Ubuntu 24.04's default AppArmor policy,
  containers under default seccomp profiles, HPC nodes with
  `user.max_user_namespaces=0`), the replicas run with `loopback_bind.c` in LD_PRELOAD:
  a wildcard `bind()` becomes loopback, an unbound `listen()` is bound to loopback
  first, any other non-loopback bind is refused. Loopback is shared by every user of
  the host, so `accept()`/`accept4()` keep only connections whose connecting socket
  belongs to the replica's own (effective) uid, read from `/proc/self/net/tcp{,6}`;
  another uid's connection is reset before the server sees a byte of it (counted,
  `refused_connections()`, and said on stderr at most once a second). What stays open:
  processes of the run's own uid can connect, as they could enter a namespace of that
  uid; root can do anything; a binary that skips libc's `accept` (static, raw syscall)
  is not filtered (Courier's and Reverb's gRPC call `accept4` through libc).
  Acting: no measurable cost, ~20 accepts a run at start-up (bench/published/acting_loopback.json).

`choose_isolation()` picks the first mechanism the host really offers: the namespace
probe brings `lo` up inside one (on Ubuntu 24.04 `unshare -rn true` succeeds but `lo`
cannot be brought up), the loopback probe runs this Python with the library preloaded
and looks where a wildcard bind landed. `listening_sockets()` / `non_loopback_listeners()`
read `/proc/<pid>/fd` and the process's own `/proc/<pid>/net/tcp{,6}` and `udp{,6}`, so
a start-up check sees what listens whatever asked for it (a static binary, a raw
syscall, a child that dropped LD_PRELOAD: none goes through the interposer).

The library is built by `scripts/setup` (`python -m seedacme.runtime.isolation build`)
into the venv, `<sys.prefix>/lib/seedacme/libloopback_bind.so`, with the source's
SHA-256 compiled into it, so a library built from an older source is found stale here
rather than silently preloaded. Stdlib only: launchers import this before anything heavy.

Why ~380 lines: building and finding the interposer, probing both mechanisms truthfully,
and reading what actually listens from /proc are one decision: which isolation holds.
"""

import ctypes
import hashlib
import ipaddress
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from typing import Dict, Iterable, List, NamedTuple, Sequence

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'loopback_bind.c')
LIBRARY_NAME = 'libloopback_bind.so'
MECHANISMS = ('namespace', 'loopback')
_MARK = b'seedacme-loopback-bind-source-sha256:'
_PROBE_TIMEOUT_S = 30


class IsolationError(RuntimeError):
  """A mechanism asked for cannot be used; the message says why."""


class Library(NamedTuple):
  """The preload library: `path` when usable, else None and `problem` saying why."""
  path: str | None
  problem: str | None


class Isolation(NamedTuple):
  """What `choose_isolation` picked: 'namespace', 'loopback' or None (neither holds),
  and why (the weaker mechanism's reason names what the stronger one lacked)."""
  mechanism: str | None
  reason: str


class Listener(NamedTuple):
  """A socket a process accepts on: TCP in LISTEN, or UDP bound and not connected."""
  pid: int
  proto: str  # 'tcp' | 'udp'
  address: str  # as ipaddress prints it: '127.0.0.1', '::ffff:127.0.0.1', '::'
  port: int


# ---------------------------------------------------------------------------------------
# The mechanisms.

def namespace_problem() -> str | None:
  """Why this host cannot give the replicas a private network namespace (None: it can).
  Truthful where `unshare -rn true` is not: the probe brings `lo` up in one, as the
  tunnel does."""
  for tool in ('unshare', 'nsenter', 'ip'):
    if shutil.which(tool) is None:
      return f'{tool} is not installed (util-linux / iproute2)'
  try:
    probe = subprocess.run(['unshare', '-rn', 'sh', '-c', 'ip link set lo up'],
                           capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired:
    return f'`unshare -rn` did not finish in {_PROBE_TIMEOUT_S} s'
  if probe.returncode != 0:
    why = ' '.join(probe.stderr.split()) or f'exit status {probe.returncode}'
    return f'no private network namespace (unshare -rn, then lo up: {why})'
  return None


LIBRARY_ENV = 'SEEDACME_LOOPBACK_LIBRARY'
# Another 127/8 address for the wildcard binds (default 127.0.0.1): the Vertex emulation's
# containers each have one (launchers/vertex.py).
ADDRESS_ENV = 'SEEDACME_LOOPBACK_ADDRESS'


def library_path() -> str:
  """Where `scripts/setup` builds the library: inside the venv this Python runs from
  (`SEEDACME_LOOPBACK_LIBRARY` names another; tests name a missing one)."""
  return os.environ.get(LIBRARY_ENV) or os.path.join(sys.prefix, 'lib', 'seedacme',
                                                     LIBRARY_NAME)


def source_digest() -> str:
  with open(SOURCE, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def compiler() -> str | None:
  """The C compiler: $CC if set, else cc or gcc on PATH (None: none)."""
  for name in (os.environ.get('CC'), 'cc', 'gcc'):
    if name and shutil.which(name):
      return shutil.which(name)
  return None


def build_library(path: str | None = None) -> str:
  """Compiles `loopback_bind.c` to `path` (default `library_path()`), the source's
  digest compiled in; replaces an existing file atomically (a replica starting meanwhile
  preloads the old or the new, never half of one). Returns the path."""
  path = os.path.abspath(path or library_path())
  cc = compiler()
  if cc is None:
    raise IsolationError('no C compiler (cc, gcc or $CC) to build the loopback interposer')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  marker = (_MARK + source_digest().encode()).decode()
  fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path), dir=os.path.dirname(path))
  os.close(fd)
  try:
    # The marker rides in a string constant a tiny second unit exports.
    cmd = [cc, '-shared', '-fPIC', '-O2', '-Wall', '-o', tmp, SOURCE, '-x', 'c', '-',
           '-ldl']
    unit = f'const char seedacme_loopback_bind_source[] = "{marker}";\n'
    built = subprocess.run(cmd, input=unit, capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
      raise IsolationError(f'building {SOURCE} failed ({" ".join(cmd)}):\n'
                           f'{built.stderr.strip()}')
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return path


def preload_library(path: str | None = None) -> Library:
  """The built library (default `library_path()`) if present and built from the current
  source, else a `Library` whose `problem` says what to do."""
  path = os.path.abspath(path or library_path())
  if not os.path.isfile(path):
    return Library(None, f'{path} is not built (scripts/setup builds it with a C compiler;'
                         ' none was found there, or setup predates it)')
  if any(c in path for c in ': \t\n'):
    return Library(None, f'{path}: LD_PRELOAD cannot name a path with a colon or blank')
  with open(path, 'rb') as f:
    built = f.read()
  if _MARK + source_digest().encode() not in built:
    return Library(None, f'{path} was built from another version of {SOURCE}: rerun '
                         'scripts/setup')
  return Library(path, None)


_PROBE = r'''
import socket
out = []
for family, host in ((socket.AF_INET, ''), (socket.AF_INET6, '::')):
  s = socket.socket(family, socket.SOCK_STREAM)
  s.bind((host, 0))
  out.append(s.getsockname()[0])
s.listen()
s.settimeout(10)
c = socket.create_connection(('127.0.0.1', s.getsockname()[1]))
try:
  out.append('accepted' if s.accept()[1][1] == c.getsockname()[1] else 'another')
except socket.timeout:
  out.append('refused')
print(' '.join(out))
'''


def loopback_problem(library: str | None = None) -> str | None:
  """Why the loopback mechanism does not hold here (None: it does): the library is
  missing or stale, or this Python, started with it preloaded, still binds a wildcard
  where a wildcard is asked for (a static or setuid interpreter ignores LD_PRELOAD), or
  does not accept a connection of its own uid (the filter cannot read /proc)."""
  found = preload_library(library)
  if found.problem:
    return found.problem
  try:
    probe = subprocess.run([sys.executable, '-S', '-c', _PROBE], capture_output=True,
                           text=True, timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                           env=loopback_env(os.environ, found.path))
  except subprocess.TimeoutExpired:
    return f'the preload probe did not finish in {_PROBE_TIMEOUT_S} s'
  got = probe.stdout.split()
  if probe.returncode != 0 or got != ['127.0.0.1', '::ffff:127.0.0.1', 'accepted']:
    return (f'{sys.executable} with {found.path} preloaded bound a wildcard to '
            f'{got[:2] or "nothing"}, and its own connection: {got[2:] or "none"} '
            f'({" ".join(probe.stderr.split())[-300:]})')
  return None


def choose_isolation(mechanisms: Sequence[str] = MECHANISMS,
                     library: str | None = None) -> Isolation:
  """The first of `mechanisms` (strongest first) the host offers, and why; mechanism
  None with every one's problem when none does."""
  unknown = [m for m in mechanisms if m not in MECHANISMS]
  if unknown or not mechanisms:
    raise ValueError(f'isolation mechanisms {list(mechanisms)!r}: each must be one of '
                     f'{MECHANISMS}')
  problems = []
  for mechanism in mechanisms:
    if mechanism == 'namespace':
      problem = namespace_problem()
      if problem is None:
        return Isolation('namespace', 'a private network namespace: the servers are '
                                      "reachable only inside it")
    else:
      problem = loopback_problem(library)
      if problem is None:
        return Isolation('loopback', '; '.join(
            problems + ['servers bound to loopback by an LD_PRELOAD interposer, which '
                        'refuses connections from other uids at accept; processes of '
                        'this uid can connect, as they could enter a namespace of it']))
    problems.append(f'{mechanism}: {problem}')
  return Isolation(None, '; '.join(problems))


def loopback_env(env: Dict[str, str] | None = None,
                 library: str | None = None) -> Dict[str, str]:
  """A copy of `env` (default os.environ) whose LD_PRELOAD starts with the library,
  keeping what was preloaded already. Raises IsolationError if it is not usable."""
  found = preload_library(library)
  if found.problem:
    raise IsolationError(f'the loopback mechanism is unavailable: {found.problem}')
  env = dict(os.environ if env is None else env)
  others = [p for p in env.get('LD_PRELOAD', '').replace(':', ' ').split()
            if p != found.path]
  env['LD_PRELOAD'] = ' '.join([found.path] + others)
  return env


def preload_active() -> bool:
  """Whether this process runs with the interposer loaded (a replica can check it: ld.so
  ignores a preload it cannot open, with one line on stderr)."""
  try:
    return hasattr(ctypes.CDLL(None), 'seedacme_loopback_bind_active')
  except OSError:
    return False


def refused_connections() -> int | None:
  """How many connections the interposer has refused in this process (another uid, or
  no owner found); None when it is not loaded."""
  try:
    return ctypes.c_ulong.in_dll(ctypes.CDLL(None), 'seedacme_loopback_refusals').value
  except (OSError, ValueError):
    return None


# ---------------------------------------------------------------------------------------
# What listens.

def process_tree(pids: Iterable[int]) -> List[int]:
  """`pids` and all their living descendants (from /proc/*/stat)."""
  parent = {}
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          stat = f.read()
      except OSError:
        continue  # exited meanwhile
      parent[int(entry)] = int(stat[stat.rindex(')') + 2:].split()[1])
  tree, todo = set(), list(pids)
  while todo:
    pid = todo.pop()
    if pid not in tree:
      tree.add(pid)
      todo.extend(child for child, ppid in parent.items() if ppid == pid)
  return sorted(tree)


def _address(hex_text: str) -> str:
  """An address as /proc/net/{tcp,udp}{,6} prints it (32-bit words in host order)."""
  words = [int(hex_text[i:i + 8], 16) for i in range(0, len(hex_text), 8)]
  ip = ipaddress.ip_address(b''.join(struct.pack('=I', w) for w in words))
  mapped = getattr(ip, 'ipv4_mapped', None)  # 3.10 prints it '::ffff:7f00:1'
  return f'::ffff:{mapped}' if mapped is not None else str(ip)


def _table(pid: int, name: str) -> Dict[int, tuple]:
  """inode -> (address, port) of the accepting sockets in /proc/<pid>/net/<name>."""
  accepting = '0A' if name.startswith('tcp') else '07'  # TCP_LISTEN; UDP unconnected
  found = {}
  try:
    with open(f'/proc/{pid}/net/{name}') as f:
      next(f)
      for line in f:
        fields = line.split()
        if fields[3] == accepting:
          address, port = fields[1].split(':')
          found[int(fields[9])] = (_address(address), int(port, 16))
  except FileNotFoundError:  # no IPv6 in that kernel, or the process exited
    pass
  return found


def _canonical(address: str) -> str:
  ip = ipaddress.ip_address(address.split('%')[0])
  mapped = getattr(ip, 'ipv4_mapped', None)
  return str(mapped if mapped is not None else ip)


def peer_uid(sock) -> int | None:
  """The uid owning the other end of a loopback TCP connection `sock` accepted (the
  connecting socket's row of /proc/self/net/tcp{,6}, ends swapped); None when not
  found (the peer closed, or it is not on this host). What the interposer does in C
  for the replicas, for a Python listener on loopback (the TLS relay's aliases)."""
  try:
    peer, here = sock.getpeername(), sock.getsockname()
  except OSError:  # closed already
    return None
  want = ((_canonical(peer[0]), peer[1]), (_canonical(here[0]), here[1]))
  for name in ('tcp', 'tcp6'):
    try:
      with open(f'/proc/self/net/{name}') as f:
        next(f)
        for line in f:
          fields = line.split()
          if fields[3] != '01':  # ESTABLISHED
            continue
          local, remote = (tuple(fields[i].split(':')) for i in (1, 2))
          ends = ((_canonical(_address(local[0])), int(local[1], 16)),
                  (_canonical(_address(remote[0])), int(remote[1], 16)))
          if ends == want:
            return int(fields[7])
    except FileNotFoundError:
      continue
  return None


def listening_sockets(pids: Iterable[int]) -> List[Listener]:
  """Every socket the processes `pids` accept on, read from the kernel: each socket fd
  of /proc/<pid>/fd looked up in that process's network namespace's tables. A pid that
  is gone is skipped; one whose fds cannot be read raises IsolationError."""
  listeners, tables = [], {}
  for pid in pids:
    try:
      inodes = set()
      for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
          target = os.readlink(f'/proc/{pid}/fd/{fd}')
        except FileNotFoundError:
          continue  # closed meanwhile
        if target.startswith('socket:['):
          inodes.add(int(target[len('socket:['):-1]))
      netns = os.stat(f'/proc/{pid}/ns/net').st_ino
    except (FileNotFoundError, ProcessLookupError):
      continue
    except PermissionError as e:
      raise IsolationError(f'cannot read the sockets of pid {pid}: {e}') from e
    if netns not in tables:
      tables[netns] = {proto: {**_table(pid, proto), **_table(pid, proto + '6')}
                       for proto in ('tcp', 'udp')}
    for proto, table in tables[netns].items():
      for inode in sorted(inodes & table.keys()):
        listeners.append(Listener(pid, proto, *table[inode]))
  return listeners


def is_loopback(address: str) -> bool:
  """127.0.0.0/8, ::1, or an IPv4-mapped 127.x (Python 3.10 says no to the last)."""
  ip = ipaddress.ip_address(address)
  if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
    ip = ip.ipv4_mapped
  return ip.is_loopback


def non_loopback_listeners(pids: Iterable[int]) -> List[Listener]:
  """The sockets of `pids` that another host could reach: empty is the start-up check's
  pass."""
  return [s for s in listening_sockets(pids) if not is_loopback(s.address)]


def exposed_listeners(pids: Iterable[int]) -> List[str]:
  """The loopback mechanism's start-up check, as the launchers say it: every socket of
  `pids` and their descendants listening beyond loopback ('tcp 10.0.0.2:7000 (pid N)');
  empty: none."""
  return [f'{s.proto} {s.address}:{s.port} (pid {s.pid})'
          for s in non_loopback_listeners(process_tree(pids))]


def _main(argv: List[str]) -> int:
  """`build [PATH]`: (re)build the library when missing or stale, saying what happened
  (for scripts/setup; exit 0 when no compiler: the launcher reports the mechanism as
  unavailable). `choose`: print what `choose_isolation()` picks."""
  if argv[:1] == ['build'] and len(argv) <= 2:
    path = argv[1] if len(argv) == 2 else None
    if preload_library(path).problem is None:
      return 0
    try:
      print(f'seedacme setup: built {build_library(path)} (the loopback fallback)')
    except (IsolationError, OSError) as e:
      print(f'seedacme setup: {e}; runs on hosts without namespaces will refuse to start',
            file=sys.stderr)
    return 0
  if argv == ['choose']:
    print('{} ({})'.format(*choose_isolation()))
    return 0
  print('usage: python -m seedacme.runtime.isolation build [PATH] | choose', file=sys.stderr)
  return 2


if __name__ == '__main__':
  sys.exit(_main(sys.argv[1:]))
