"""Runs `run_local` as a real multi-process Launchpad program for integration tests.

Each launch gets its own HOME and TMPDIR under the test's tmp dir, and a unique tag in
its environment that every node process inherits; `leftover_processes(tag)` finds any
process still carrying it (an orphan).
"""

import json
import os
import re
import signal
import socket
import tempfile
import time
import uuid
from typing import Dict, List

from seedacme.run import logdir as logdir_lib
from seedacme.launchers import process
from seedacme.runtime import isolation

TAG_VAR = 'SEEDACME_TEST_TAG'
LAUNCHED: List['Run'] = []  # every Run of this pytest process (conftest kills what outlives its test)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Runs a command as on a host where no user namespace can be made (Ubuntu 24.04's
# default, containers, HPC nodes): ../shared/notes/hosts-without-namespaces.md.
WITHOUT_NAMESPACES = [os.path.join(REPO, 'scripts', 'without_namespaces')]


def tmpdir_without_underscore(prefix: str) -> str:
  """A new dir under /tmp without '_' (Launchpad 0.5.0's Vertex temp dirs cannot have one;
  pytest's paths have)."""
  while True:
    path = tempfile.mkdtemp(prefix=prefix, dir='/tmp')
    if '_' not in path:
      return path
    os.rmdir(path)


def leftover_processes(tag: str) -> List[int]:
  """Pids of live processes whose environment carries `tag`."""
  pids = []
  needle = f'{TAG_VAR}={tag}'.encode()
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/environ', 'rb') as f:
        if needle in f.read().split(b'\0'):
          with open(f'/proc/{entry}/stat') as s:
            if s.read().split(') ')[-1].startswith('Z'):
              continue  # zombie: already dead
          pids.append(int(entry))
    except OSError:
      continue
  return pids


def _host_addresses() -> List[str]:
  """This host's non-loopback IPv4 addresses (what another machine would dial)."""
  return [address for _, name in socket.if_nameindex() if name != 'lo'
          for address in _ipv4_of(name)]


def _ipv4_of(interface: str) -> List[str]:
  import fcntl  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    try:  # SIOCGIFADDR: the interface's (first) IPv4 address
      got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', interface.encode()[:15]))
    except OSError:
      return []  # no IPv4 address
  return [socket.inet_ntoa(got[20:24])]


def check_servers_isolated(output: str, pids: List[int]) -> str:
  """Asserts a running local program (`pids`: its processes) keeps its servers off the
  network the way its launcher said it would (`seedacme: isolation: <mechanism>` in
  `output`); returns the mechanism. 'namespace': every node in one network namespace
  that is not this process's, its ports unreachable from here. 'loopback' (a host
  without namespaces): nothing of the run listens beyond loopback, read from the kernel
  (`/proc/<pid>/net/tcp{,6}`), and this host's own addresses refuse every port. Where
  the run requires namespaces (`SEEDACME_REQUIRE_NAMESPACES=1`) it must be 'namespace'."""
  said = re.findall(r'seedacme: isolation: (\w+) \(', output)
  assert len(said) == 1 and said[0] in isolation.MECHANISMS, output[:3000]
  mechanism = said[0]
  if os.environ.get('SEEDACME_REQUIRE_NAMESPACES') == '1':
    assert mechanism == 'namespace', output[:3000]
  assert pids, 'no process of the program is running'
  listeners = isolation.listening_sockets(pids)  # each in its own process's namespace
  ports = sorted({s.port for s in listeners if s.proto == 'tcp'})
  assert len(ports) >= 2, listeners  # Courier (learner) and Reverb at least
  if mechanism == 'namespace':  # they bind [::], in a namespace of their own
    own_ns = os.readlink('/proc/self/ns/net')
    node_ns = {os.readlink(f'/proc/{pid}/ns/net') for pid in pids}
    assert own_ns not in node_ns and len(node_ns) == 1, (own_ns, node_ns)
    unreachable_at = ['127.0.0.1']
  else:
    assert not isolation.non_loopback_listeners(pids), listeners
    unreachable_at = _host_addresses()
  for address in unreachable_at:
    for port in ports:
      with socket.socket() as s:
        s.settimeout(1)
        assert s.connect_ex((address, port)) != 0, f'{address}:{port} reachable'
  return mechanism


def wait_for(predicate, timeout: float, run: 'Run', interval_s: float = 0.5) -> bool:
  """Polls `predicate` until it holds, `timeout` passes or the program ends."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and run.proc.poll() is None:
    if predicate():
      return True
    time.sleep(interval_s)
  return predicate()


def supervised_child(run: 'Run', node: str) -> int:
  """Pid of the process doing `node`'s work (the supervisor's child, not its standby),
  from the supervisor's own log lines."""
  with open(os.path.join(run.logdir, 'nodes', node), errors='replace') as f:
    found = re.findall(r'started child process (\d+)|standby process (\d+) takes over',
                       f.read())
  pids = [int(a or b) for a, b in found]
  alive = [p for p in pids if p in leftover_processes(run.tag)]
  if not pids or pids[-1] not in alive:
    raise AssertionError(f'no live supervised child for {node} (logged: {pids})')
  return pids[-1]


def checkpointed_learner_step(logdir: str) -> int | None:
  """Learner step of the latest checkpoint under `<logdir>/checkpoints` (None: none yet)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  if path is None:
    return None
  return int(tf.train.load_variable(path, 'learner_steps/.ATTRIBUTES/VARIABLE_VALUE'))


def target_value(summary: Dict) -> float:
  """The average return that met the target (the summary's typed stop reason)."""
  stop = summary['stop']
  assert stop['kind'] in ('target', 'eval_target'), stop
  return float(stop['value'])


class Run:
  """A launched program: its process, logdir and what it printed.

  Used as `with Run(...) as run: <poke at it>; run.complete(timeout)`: a test that fails
  before the program ends kills it on the way out.
  """

  def __init__(self, args: List[str], workdir: str, logdir: str | None = None,
               register: str | None = None, prefix: List[str] = ()):
    """`register`: a module (importable from the repository) that registers agents or
    envs before run_local parses its flags (`launchers.process.command`); `prefix`: a
    command run_local runs under (`WITHOUT_NAMESPACES`: a host without namespaces)."""
    self.tag = uuid.uuid4().hex
    self.logdir = logdir or os.path.join(workdir, 'logdir')
    tmp = os.path.join(workdir, 'tmp')
    home = os.path.join(workdir, 'home')
    os.makedirs(tmp, exist_ok=True)
    os.makedirs(home, exist_ok=True)
    self.stdout_path = os.path.join(workdir, 'stdout.txt')
    self._out = open(self.stdout_path, 'w')
    env = {'HOME': home, 'TMPDIR': tmp, TAG_VAR: self.tag}
    if register is not None:
      env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')]))
    self.proc = process.start(args, self.logdir, self._out, env=env, register=register,
                              prefix=prefix)
    LAUNCHED.append(self)

  def __enter__(self) -> 'Run':
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None:
      self.kill()

  def wait(self, timeout: float) -> int:
    try:
      return self.proc.wait(timeout)
    except BaseException:  # a timeout, or Ctrl-C on pytest: the program goes with the wait
      self.kill()
      raise

  def kill(self) -> None:
    """Last resort for a hung test: kill everything carrying our tag."""
    for pid in leftover_processes(self.tag):
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    self.proc.wait(10)

  def interrupt(self) -> None:
    """Ctrl-C, as a user at the terminal would press it."""
    self.proc.send_signal(signal.SIGINT)

  @property
  def output(self) -> str:
    self._out.flush()
    with open(self.stdout_path) as f:
      return f.read()

  def progress(self) -> List[Dict]:
    return logdir_lib.read_progress(self.logdir)

  def events(self) -> List[str]:
    return logdir_lib.read_events(self.logdir)

  def json(self, name: str) -> Dict | None:
    path = os.path.join(self.logdir, name)
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def node_log(self, node: str) -> str:
    with open(os.path.join(self.logdir, 'nodes', node)) as f:
      return f.read()

  def complete(self, timeout: float) -> None:
    """Waits for the program to end by itself; asserts exit code 0 and no process left."""
    try:
      code = self.wait(timeout)
    finally:
      leftovers = self.wait_for_no_leftovers()
    assert code == 0, self.output[-3000:]
    assert not leftovers, f'processes left behind: {leftovers}'

  def wait_for_no_leftovers(self, timeout: float = 15.0) -> List[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      left = leftover_processes(self.tag)
      if not left:
        return []
      time.sleep(0.5)
    return leftover_processes(self.tag)
