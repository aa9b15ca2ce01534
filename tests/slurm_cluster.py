"""A real Slurm cluster on this machine for tests: slurmctld and one slurmd per host.

Each node is an emulated host of issue 37 (`tests/emulated_hosts.py`): its own network
namespace and address on a private bridge, and `slurm.conf` says so
(`NodeName=n1 NodeAddr=10.77.0.3`), so a job's allocation names real per-host addresses
and what the Slurm launcher derives from it -- the cluster spec, each host's TLS
endpoint -- crosses hosts as on a real cluster. slurmctld runs on a host of its own,
`ctl` (the controller and the login node: `client` and `run` reach the cluster from
there), every daemon on the standard ports (6817, 6818: each host has its own).

Shaped by what Slurm 22.05 needs: the hosts' namespaces are made without a user
namespace (`user_namespace=False`, root only), since slurmctld, slurmd and every job
step call `setgroups`, which a user namespace refuses; and `ip netns exec` mounts a
fresh /sys, so a slurmd first mounts the cgroup v1 layout its cgroup plugin probes (a
tmpfs and a `name=systemd` hierarchy; the plugin only looks: proctrack is linuxproc,
tasks are not bound). The hosts' processes live in one PID namespace whose end kills
them all, so no daemon or job process outlives `close()`, however the test ends.
Munge is a munged of the cluster's own (its own key and socket, `AuthInfo=socket=`):
a Unix socket in the cluster's temp dir, which every host's namespace reaches.
The backfill scheduler runs every second: Slurm schedules heterogeneous jobs only by
backfill, whose default 30 s interval made a het job wait ~25 s.

Everything else lives in one temp dir and goes with it (the conf, state and spool
dirs, the logs). By hand: `python -m tests.slurm_cluster -- <command>` starts it, runs the command
on the login host (`SLURM_CONF` set) and stops it when the command ends.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from tests.emulated_hosts import EmulatedHosts

DAEMONS = ('slurmctld', 'slurmd', 'munged', 'mungekey', 'sbatch', 'nsenter', 'setpriv')
LOGIN = 'ctl'  # the controller's host, where clients run
CTLD_PORT, SLURMD_PORT = 6817, 6818
# Before slurmd, on its host: the cgroup v1 layout slurmd's cgroup plugin probes.
_CGROUP_PROBE = ('mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && '
                 'mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && '
                 'exec "$@"')


def skip_reason() -> str | None:
  """Why no Slurm cluster can be started here (None: it can)."""
  missing = [d for d in DAEMONS if shutil.which(d) is None]
  if missing:
    return (f'Slurm is not installed ({", ".join(missing)} missing): '
            'apt-get install slurm-wlm munge')
  if os.geteuid() != 0:
    return 'the emulated Slurm cluster runs its daemons as root'
  from tests.emulated_hosts import unavailable  # pylint: disable=g-import-not-at-top
  why = unavailable()
  return f'emulated hosts: {why}' if why else None


class SlurmCluster:
  """`with SlurmCluster(['n1', 'n2', 'n3']) as slurm: slurm.run(['sinfo'])`."""

  def __init__(self, nodes: List[str], cpus: int = 2, kill_wait_s: int = 30,
               slurmd_timeout_s: int = 60, startup_s: float = 60.0):
    """`slurmd_timeout_s`: how long a node may not answer before the controller
    gives up on it (a lost node is then not responding within ~1.5x that, measured at
    20 s); shorter is faster to test a lost node, longer safer at high load."""
    self.nodes = nodes
    self._cpus, self._kill_wait, self._startup_s = cpus, kill_wait_s, startup_s
    self._slurmd_timeout = slurmd_timeout_s
    self.dir = ''
    self.hosts: EmulatedHosts | None = None
    self.addresses: Dict[str, str] = {}
    self._munged: subprocess.Popen | None = None
    self._daemons: Dict[str, int] = {}  # name -> the hosts' handle

  @property
  def env(self) -> Dict[str, str]:
    """The environment a Slurm client of this cluster needs."""
    return dict(os.environ, SLURM_CONF=os.path.join(self.dir, 'slurm.conf'))

  def client(self, command: List[str]) -> List[str]:
    """`command` as run on the login host (its network namespace, this process's
    everything else): how a test reaches the cluster, and how it submits."""
    return ['nsenter', f'--net=/proc/{self.hosts.pid1}/root/run/netns/host-{LOGIN}',
            *command]

  def run(self, command: List[str], check: bool = True, timeout: float = 30.0) -> str:
    done = subprocess.run(self.client(command), env=self.env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
      raise RuntimeError(f'{command} exited {done.returncode}: {done.stderr.strip()}')
    return done.stdout

  def conf(self) -> str:
    d = self.dir
    lines = [
        'ClusterName=seedacmetest',
        f'SlurmctldHost={socket.gethostname().split(".")[0]}({self.addresses[LOGIN]})',
        f'SlurmctldPort={CTLD_PORT}', f'SlurmdPort={SLURMD_PORT}',
        'AuthType=auth/munge', 'CredType=cred/munge',
        f'AuthInfo=socket={d}/munge.sock',
        'SlurmUser=root', 'SlurmdUser=root',
        f'StateSaveLocation={d}/state', f'SlurmdSpoolDir={d}/spool/%n',
        f'SlurmctldPidFile={d}/slurmctld.pid', f'SlurmdPidFile={d}/slurmd-%n.pid',
        f'SlurmctldLogFile={d}/slurmctld.log', f'SlurmdLogFile={d}/slurmd-%n.log',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none',
        'SelectType=select/cons_tres', 'SelectTypeParameters=CR_Core',
        'SchedulerType=sched/backfill', 'SchedulerParameters=bf_interval=1',
        'MpiDefault=none', 'ReturnToService=2', f'KillWait={self._kill_wait}',
        f'SlurmdTimeout={self._slurmd_timeout}',
        'JobCompType=jobcomp/none',
        'AccountingStorageType=accounting_storage/none',
        'JobAcctGatherType=jobacct_gather/none',
    ]
    for node in self.nodes:
      lines.append(f'NodeName={node} NodeHostname=localhost '
                   f'NodeAddr={self.addresses[node]} CPUs={self._cpus}')
    lines.append('PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP '
                 'OverSubscribe=FORCE')
    return '\n'.join(lines) + '\n'

  def __enter__(self) -> 'SlurmCluster':
    self.dir = tempfile.mkdtemp(prefix='seedacmeslurm', dir='/tmp')
    try:
      self._start()
    except BaseException:
      self.close()
      raise
    return self

  def _start(self) -> None:
    d = self.dir
    os.chmod(d, 0o711)  # munged wants its socket's directory searchable
    for sub in ('state', 'spool'):
      os.makedirs(os.path.join(d, sub))
    subprocess.run(['mungekey', '--create', '--keyfile', f'{d}/munge.key'], check=True,
                   capture_output=True)
    with open(os.path.join(d, 'munged.out'), 'w') as out:
      self._munged = subprocess.Popen(
          ['munged', '--foreground', '--force', f'--socket={d}/munge.sock',
           f'--key-file={d}/munge.key', f'--pid-file={d}/munged.pid',
           f'--log-file={d}/munged.log', f'--seed-file={d}/munged.seed'],
          stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    self._wait('munged', lambda: os.path.exists(f'{d}/munge.sock'), 10)
    self.hosts = EmulatedHosts([LOGIN, *self.nodes], agent_log=f'{d}/hosts.log',
                               user_namespace=False)
    self.addresses = dict(self.hosts.addresses)
    with open(os.path.join(d, 'slurm.conf'), 'w') as f:
      f.write(self.conf())
    self._spawn('slurmctld', LOGIN, ['slurmctld', '-D', '-i'])
    for node in self.nodes:
      self._spawn(f'slurmd-{node}', node,
                  ['sh', '-c', _CGROUP_PROBE, 'sh', 'slurmd', '-D', '-N', node])
    self._wait('every node idle', lambda: self.idle() == len(self.nodes), self._startup_s)

  def _spawn(self, name: str, host: str, command: List[str]) -> None:
    env = {'SLURM_CONF': os.path.join(self.dir, 'slurm.conf')}
    self._daemons[name] = self.hosts.run(host, command, env=env,
                                         log=os.path.join(self.dir, f'{name}.out'))

  def _wait(self, what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      dead = [n for n, h in self._daemons.items() if self.hosts.poll(h) is not None]
      if self._munged is not None and self._munged.poll() is not None:
        dead.append('munged')
      if dead:
        raise RuntimeError(f'{dead[0]} exited: {self.log(dead[0])[-2000:]}')
      if predicate():
        return
      time.sleep(0.3)
    raise RuntimeError(f'Slurm: timed out waiting for {what}; sinfo: '
                       f'{self.run(["sinfo"], check=False) if self.hosts else ""}')

  def idle(self) -> int:
    """How many nodes are idle."""
    try:
      out = self.run(['sinfo', '-h', '-N', '-o', '%N %t'], check=False, timeout=10)
    except subprocess.TimeoutExpired:
      return 0
    return sum(1 for line in out.splitlines() if line.split()[1:] == ['idle'])

  def log(self, name: str) -> str:
    try:
      with open(os.path.join(self.dir, f'{name}.out'), errors='replace') as f:
        return f.read()
    except OSError:
      return ''

  def kill_node(self, node: str) -> int:
    """A lost host: every process on it (its slurmd, slurmstepds, the job's tasks and
    their replicas) killed (SIGKILL). Returns how many processes were killed."""
    return self.hosts.kill_host(node)

  def run_as(self, node: str, uid: int, argv: List[str],
             timeout: float = 30.0) -> Tuple[int | None, str]:
    """`argv` on `node` as `uid` (its gid too, no other groups): another user of the
    node. Returns (exit code, None if it was killed at `timeout`; its output)."""
    log = os.path.join(self.dir, f'as-{uid}-{node}-{time.monotonic_ns()}.out')
    handle = self.hosts.run(node, ['setpriv', f'--reuid={uid}', f'--regid={uid}',
                                   '--clear-groups', *argv], log=log)
    code = self.hosts.wait(handle, timeout)
    if code is None:
      self.hosts.signal(handle, signal.SIGKILL)
    with open(log, errors='replace') as f:
      return code, f.read()

  def job_state(self, job: int) -> str:
    """The job's state per `squeue` ('' once it left the queue)."""
    out = self.run(['squeue', '-h', '-j', str(job), '-o', '%T'], check=False)
    states = set(out.split())
    return ','.join(sorted(states))

  def close(self) -> None:
    """Ends the hosts (every daemon and job process dies with their PID namespace),
    then munged, and removes the cluster's dir."""
    if self.hosts is not None:
      self.hosts.close()
      self.hosts = None
    self._daemons.clear()
    if self._munged is not None and self._munged.poll() is None:
      self._munged.send_signal(signal.SIGTERM)
      try:
        self._munged.wait(15)
      except subprocess.TimeoutExpired:
        self._munged.kill()
        self._munged.wait()
    if self.dir:
      shutil.rmtree(self.dir, ignore_errors=True)

  def __exit__(self, *exc) -> None:
    self.close()


def _by_hand(argv: List[str]) -> int:
  """Starts a cluster of n1..n3, runs `argv` on the login host, stops the cluster."""
  if argv[:1] == ['--']:
    argv = argv[1:]
  why = skip_reason()
  if why:
    print(f'slurm_cluster: {why}', file=sys.stderr)
    return 1
  with SlurmCluster(['n1', 'n2', 'n3']) as slurm:
    print(f'slurm_cluster: up (nodes {slurm.addresses}); running {argv}', flush=True)
    return subprocess.run(slurm.client(argv or ['sinfo']), env=slurm.env,
                          check=False).returncode


if __name__ == '__main__':
  sys.exit(_by_hand(sys.argv[1:]))
