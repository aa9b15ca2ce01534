"""Several hosts on one machine, for tests of what crosses a network (issue 37).

`EmulatedHosts(['a', 'b', 'c'])` builds, unprivileged, one network namespace per host,
each with its own loopback and one address on a private bridge (10.77.0.2, .3, ...),
all inside one new user, mount, network and PID namespace:

    test process ──stdin/stdout JSON──▶ agent (PID 1 of the new PID namespace)
                                          ├─ bridge br0 (no route out: no uplink)
                                          ├─ netns host-a  10.77.0.2  veth ⇄ br0
                                          ├─ netns host-b  10.77.0.3  veth ⇄ br0
                                          └─ ...

`run(host, argv)` starts a command "on" a host (`ip netns exec`); `link(host, up)`
takes its link down and up; `kill_host(host)` SIGKILLs every process whose network
namespace is that host's, and their descendants (what it runs, however it was
started: a launcher's own children included, and its replicas in their private
namespace); `close()` ends the agent. Everything lives in the agent's PID namespace,
so whatever way the agent ends (`close`, an exception, `kill -9` of the test), the
kernel kills every process left in it, and the namespaces and the tmpfs holding them go
with their last process: nothing can be left behind.

Traffic stays inside: the bridge has no uplink and the namespaces no default route,
so a test can send only to addresses these hosts own. Where user namespaces are
unavailable, `unavailable()` says why (tests skip naming it), unless the run requires
them (`SEEDACME_REQUIRE_NAMESPACES=1`, as CI sets: `skip_reason()` then raises, so a
passing CI run is one where these tests ran, not skipped).

By hand: `python -m tests.emulated_hosts a b c` builds the hosts, prints each one's
address and the `nsenter` command that opens a shell on it, and tears everything
down on Ctrl-C.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Sequence

SUBNET = '10.77.0'
_AGENT_FLAG = '--agent'


def unavailable() -> str | None:
  """Why emulated hosts cannot be built here (None: they can)."""
  for tool in ('unshare', 'ip'):
    if shutil.which(tool) is None:
      return f'{tool} is not installed'
  probe = subprocess.run(['unshare', '-rnmpf', '--mount-proc', 'sh', '-c',
                          'mount -t tmpfs tmpfs /run && mkdir /run/netns && '
                          'ip netns add probe && ip link add br0 type bridge'],
                         capture_output=True, text=True, timeout=30)
  if probe.returncode != 0:
    return ('unprivileged user and network namespaces are not available: '
            f'{probe.stderr.strip() or probe.returncode}')
  return None


REQUIRE_VAR = 'SEEDACME_REQUIRE_NAMESPACES'


def namespaces_required() -> bool:
  """Whether the run requires namespaces (`SEEDACME_REQUIRE_NAMESPACES=1`, as CI sets):
  tests that need them fail instead of skipping."""
  return os.environ.get(REQUIRE_VAR) == '1'


def skip_reason() -> str | None:
  """`unavailable()` for a test to skip with; raises instead where the run requires
  namespaces (`namespaces_required()`)."""
  why = unavailable()
  if why is not None and namespaces_required():
    raise RuntimeError(f'{REQUIRE_VAR}=1 but emulated hosts cannot be built here: {why}')
  return why


class HostError(RuntimeError):
  """The agent refused or failed an operation; the message says why."""


class EmulatedHosts:
  """Hosts `names` (see the module docstring). Use as a context manager."""

  def __init__(self, names: Sequence[str], agent_log: str | None = None,
               user_namespace: bool = True):
    """`user_namespace=False` (root only): the namespaces belong to the machine's own
    user namespace, so the hosts' root keeps what a user namespace takes away --
    `setgroups` above all, which Slurm's daemons call on start and for every job
    step (`tests/slurm_cluster.py`)."""
    self.names = list(names)
    self.addresses = {n: f'{SUBNET}.{i + 2}' for i, n in enumerate(self.names)}
    self._lock = threading.Lock()
    log = open(agent_log, 'w') if agent_log else subprocess.DEVNULL
    self._agent = subprocess.Popen(
        ['unshare', '-rnmpf' if user_namespace else '-nmpf', '--mount-proc',
         sys.executable, '-m', 'tests.emulated_hosts', _AGENT_FLAG, json.dumps(self.names)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if agent_log:
      log.close()
    ready = self._read()
    if not ready.get('ok'):
      self.close()
      raise HostError(f"emulated hosts not built: {ready.get('error')}")

  @property
  def agent_pid(self) -> int:
    """The `unshare` process (outside the namespaces) the agent runs under."""
    return self._agent.pid

  @property
  def pid1(self) -> int:
    """The agent inside the namespaces (`unshare -f`'s child: their PID 1), through whose
    /proc entry a process outside reaches them (`nsenter -t`, `/proc/<pid>/root/run/netns`)."""
    with open(f'/proc/{self.agent_pid}/task/{self.agent_pid}/children') as f:
      return int(f.read().split()[0])

  def __enter__(self) -> 'EmulatedHosts':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _read(self) -> Dict:
    line = self._agent.stdout.readline()
    if not line:
      raise HostError(f'the hosts agent ended (exit {self._agent.poll()})')
    return json.loads(line)

  def _call(self, **op) -> Dict:
    with self._lock:
      if self._agent.poll() is not None:
        raise HostError(f'the hosts agent ended (exit {self._agent.returncode})')
      self._agent.stdin.write(json.dumps(op) + '\n')
      self._agent.stdin.flush()
      reply = self._read()
    if not reply.get('ok'):
      raise HostError(reply.get('error'))
    return reply

  def run(self, host: str, argv: Sequence[str], env: Dict[str, str] | None = None,
          log: str | None = None, cwd: str | None = None) -> int:
    """Starts `argv` on `host` (its output to the file `log`); returns a handle."""
    return self._call(op='run', host=host, argv=list(argv), env=env or {}, log=log,
                      cwd=cwd)['handle']

  def poll(self, handle: int) -> int | None:
    """The command's exit code, or None while it runs."""
    return self._call(op='poll', handle=handle)['code']

  def wait(self, handle: int, timeout: float) -> int | None:
    """The exit code once the command ends, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
      code = self.poll(handle)
      if code is not None or time.monotonic() >= deadline:
        return code
      time.sleep(0.2)

  def signal(self, handle: int, signum: int = signal.SIGTERM) -> None:
    """Sends `signum` to the command's process group."""
    self._call(op='signal', handle=handle, signum=int(signum))

  def link(self, host: str, up: bool) -> None:
    """Takes `host`'s only link down (a partition) or up again."""
    self._call(op='link', host=host, up=up)

  def kill_host(self, host: str) -> int:
    """SIGKILLs every process in `host`'s network namespace; how many."""
    return self._call(op='kill_host', host=host)['killed']

  def processes(self, host: str) -> int:
    """How many processes run in `host`'s network namespace."""
    return self._call(op='processes', host=host)['count']

  def close(self) -> None:
    """Ends the agent: every process on every host dies with its PID namespace."""
    if self._agent.poll() is None:
      try:
        self._agent.stdin.write(json.dumps({'op': 'close'}) + '\n')
        self._agent.stdin.flush()
      except (BrokenPipeError, ValueError):
        pass
      try:
        self._agent.wait(10)
      except subprocess.TimeoutExpired:
        self._agent.kill()  # PID 1 of its namespace: the kernel kills the rest
        self._agent.wait(10)
    for stream in (self._agent.stdin, self._agent.stdout):
      try:
        stream.close()
      except (BrokenPipeError, ValueError):
        pass


# ---- the agent: PID 1 of the namespaces ---------------------------------------------

def _sh(*argv: str) -> None:
  result = subprocess.run(argv, capture_output=True, text=True)
  if result.returncode != 0:
    raise HostError(f'{" ".join(argv)}: {result.stderr.strip()}')


def _netns_inode(pid: int | str) -> str | None:
  try:
    return os.readlink(f'/proc/{pid}/ns/net')
  except OSError:
    return None


class _Agent:
  """Builds the hosts, then serves one JSON operation per stdin line."""

  def __init__(self, names: List[str]):
    self.names = names
    self.commands: Dict[int, subprocess.Popen] = {}
    self.netns: Dict[str, str] = {}
    _sh('mount', '-t', 'tmpfs', 'seedacme-hosts', '/run')
    os.makedirs('/run/netns')
    _sh('ip', 'link', 'set', 'lo', 'up')
    _sh('ip', 'link', 'add', 'br0', 'type', 'bridge')
    _sh('ip', 'link', 'set', 'br0', 'up')
    for i, name in enumerate(names):
      ns, veth = f'host-{name}', f'v{i}'
      _sh('ip', 'netns', 'add', ns)
      _sh('ip', 'link', 'add', veth, 'type', 'veth', 'peer', 'name', f'{veth}-br')
      _sh('ip', 'link', 'set', veth, 'netns', ns)
      _sh('ip', 'link', 'set', f'{veth}-br', 'master', 'br0', 'up')
      _sh('ip', '-n', ns, 'addr', 'add', f'{SUBNET}.{i + 2}/24', 'dev', veth)
      _sh('ip', '-n', ns, 'link', 'set', veth, 'up')
      _sh('ip', '-n', ns, 'link', 'set', 'lo', 'up')
      with open(f'/run/netns/{ns}') as f:  # its inode, as /proc/<pid>/ns/net shows it
        self.netns[name] = f'net:[{os.fstat(f.fileno()).st_ino}]'

  def _host(self, op: Dict) -> str:
    host = op.get('host')
    if host not in self.names:
      raise HostError(f'no host {host!r} (hosts: {", ".join(self.names)})')
    return host

  def _pids(self, host: str) -> List[int]:
    """The host's processes: those in its network namespace and their descendants (a
    launcher's replicas run in a private namespace of their own, below the host's)."""
    me = os.getpid()
    parents, members = {}, set()
    for p in os.listdir('/proc'):
      if not p.isdigit() or int(p) == me:
        continue
      try:
        with open(f'/proc/{p}/stat') as f:
          parents[int(p)] = int(f.read().rsplit(') ', 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        continue
      if _netns_inode(p) == self.netns[host]:
        members.add(int(p))
    grew = True
    while grew:
      below = {p for p, parent in parents.items() if parent in members} - members
      members |= below
      grew = bool(below)
    return sorted(members)

  def handle(self, op: Dict) -> Dict:
    kind = op.get('op')
    if kind == 'run':
      host = self._host(op)
      out = open(op['log'], 'ab') if op.get('log') else subprocess.DEVNULL
      proc = subprocess.Popen(['ip', 'netns', 'exec', f'host-{host}', *op['argv']],
                              env=dict(os.environ, **op.get('env', {})), stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              cwd=op.get('cwd'), start_new_session=True)
      if out is not subprocess.DEVNULL:
        out.close()
      self.commands[proc.pid] = proc
      return {'handle': proc.pid}
    if kind in ('poll', 'signal'):
      proc = self.commands.get(op.get('handle'))
      if proc is None:
        raise HostError(f"no command {op.get('handle')}")
      if kind == 'signal':
        try:
          os.killpg(proc.pid, op['signum'])
        except ProcessLookupError:
          pass
        return {}
      return {'code': proc.poll()}
    if kind == 'link':
      host = self._host(op)
      state = 'up' if op.get('up') else 'down'
      veth = f'v{self.names.index(host)}'
      _sh('ip', '-n', f'host-{host}', 'link', 'set', veth, state)
      _sh('ip', 'link', 'set', f'{veth}-br', state)
      return {}
    if kind == 'kill_host':
      host = self._host(op)
      killed = 0
      for _ in range(3):  # a dying launcher may start one more child: sweep again
        pids = self._pids(host)
        for pid in pids:
          try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
          except ProcessLookupError:
            pass
        time.sleep(0.1)
      for proc in self.commands.values():
        proc.poll()
      return {'killed': killed}
    if kind == 'processes':
      return {'count': len(self._pids(self._host(op)))}
    raise HostError(f'unknown operation {kind!r}')


def _serve(names: List[str]) -> int:
  try:
    agent = _Agent(names)
  except (HostError, OSError) as e:
    print(json.dumps({'ok': False, 'error': str(e)}), flush=True)
    return 1
  print(json.dumps({'ok': True, 'addresses': {n: f'{SUBNET}.{i + 2}'
                                              for i, n in enumerate(names)}}), flush=True)
  for line in sys.stdin:
    op = json.loads(line)
    if op.get('op') == 'close':
      break
    try:
      reply = {'ok': True, **agent.handle(op)}
    except (HostError, OSError, KeyError, TypeError) as e:
      reply = {'ok': False, 'error': f'{type(e).__name__}: {e}'}
    print(json.dumps(reply), flush=True)
  return 0  # PID 1 exits: the kernel kills every process left in the namespace


def _by_hand(names: List[str]) -> int:
  with EmulatedHosts(names) as hosts:
    pid1 = hosts.pid1
    for name, address in hosts.addresses.items():
      print(f'host {name}: {address}   shell: nsenter -t {pid1} -U -m -p '
            f'--preserve-credentials ip netns exec host-{name} bash')
    print('Ctrl-C to tear everything down')
    try:
      while True:
        time.sleep(3600)
    except KeyboardInterrupt:
      return 0


if __name__ == '__main__':
  if len(sys.argv) > 2 and sys.argv[1] == _AGENT_FLAG:
    sys.exit(_serve(json.loads(sys.argv[2])))
  sys.exit(_by_hand(sys.argv[1:] or ['a', 'b']))
