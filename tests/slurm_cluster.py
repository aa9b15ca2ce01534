"""A real Slurm cluster on this machine for tests: slurmctld and one slurmd per node.

Everything lives in one temp dir and goes with it: the slurm.conf (free ports for
slurmctld and each slurmd, every node `NodeHostname=localhost NodeAddr=127.0.0.1`),
the state and spool dirs, the logs, and a munged of the cluster's own (its own key
and socket, `AuthInfo=socket=...`), so the machine's munge, if any, is neither used
nor touched. Clients reach it through `SLURM_CONF` (`env`). Proctrack is linuxproc
(no cgroups needed), tasks are not bound (task/none), and the backfill scheduler runs
every second: Slurm schedules heterogeneous jobs only by backfill, whose default
30 s interval made a het job wait ~25 s (measured on this cluster).

Debian's slurm-wlm 22.05 runs several slurmd on one machine (`slurmd -N <node>`);
all nodes see the same processes, so a test tells replicas apart by their environment.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Dict, List

import portpicker

DAEMONS = ('slurmctld', 'slurmd', 'munged', 'mungekey', 'sbatch')
NODE_VAR = 'SEEDACME_SLURM_NODE'  # in a slurmd's environment: its node


def skip_reason() -> str | None:
  """Why no Slurm cluster can be started here (None: it can)."""
  missing = [d for d in DAEMONS if shutil.which(d) is None]
  if missing:
    return (f'Slurm is not installed ({", ".join(missing)} missing): '
            'apt-get install slurm-wlm munge')
  if os.geteuid() != 0:
    return 'the emulated Slurm cluster runs its daemons as root'
  return None


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
    self._daemons: Dict[str, subprocess.Popen] = {}

  @property
  def env(self) -> Dict[str, str]:
    """The environment a Slurm client of this cluster needs."""
    return dict(os.environ, SLURM_CONF=os.path.join(self.dir, 'slurm.conf'))

  def run(self, command: List[str], check: bool = True, timeout: float = 30.0) -> str:
    done = subprocess.run(command, env=self.env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
      raise RuntimeError(f'{command} exited {done.returncode}: {done.stderr.strip()}')
    return done.stdout

  def conf(self) -> str:
    d = self.dir
    ports = [portpicker.pick_unused_port() for _ in range(2 + len(self.nodes))]
    lines = [
        'ClusterName=seedacmetest',
        f'SlurmctldHost={socket.gethostname().split(".")[0]}(127.0.0.1)',
        f'SlurmctldPort={ports[0]}', f'SlurmdPort={ports[1]}',
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
    for node, port in zip(self.nodes, ports[2:]):
      lines.append(f'NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 '
                   f'CPUs={self._cpus} Port={port}')
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
    self._spawn('munged', ['munged', '--foreground', '--force', f'--socket={d}/munge.sock',
                           f'--key-file={d}/munge.key', f'--pid-file={d}/munged.pid',
                           f'--log-file={d}/munged.log', f'--seed-file={d}/munged.seed'])
    self._wait('munged', lambda: os.path.exists(f'{d}/munge.sock'), 10)
    with open(os.path.join(d, 'slurm.conf'), 'w') as f:
      f.write(self.conf())
    self._spawn('slurmctld', ['slurmctld', '-D', '-i'])
    for node in self.nodes:
      self._spawn(f'slurmd-{node}', ['slurmd', '-D', '-N', node])
    self._wait('every node idle', lambda: self.idle() == len(self.nodes), self._startup_s)

  def _spawn(self, name: str, command: List[str]) -> None:
    # A slurmd's environment carries its node's name to its slurmstepds: `kill_node`
    # finds them by it.
    env = dict(self.env, **{NODE_VAR: name.partition('slurmd-')[2]} if
               name.startswith('slurmd-') else {})
    with open(os.path.join(self.dir, f'{name}.out'), 'w') as out:
      self._daemons[name] = subprocess.Popen(command, env=env, stdout=out,
                                             stderr=subprocess.STDOUT,
                                             start_new_session=True)

  def _wait(self, what: str, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      dead = [n for n, p in self._daemons.items() if p.poll() is not None]
      if dead:
        raise RuntimeError(f'{dead[0]} exited: {self.log(dead[0])[-2000:]}')
      if predicate():
        return
      time.sleep(0.3)
    raise RuntimeError(f'Slurm: timed out waiting for {what}; sinfo: '
                       f'{self.run(["sinfo"], check=False)}')

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
    """A lost host: the node's slurmd, its slurmstepds and every task process it ran
    killed (SIGKILL). Returns how many processes were killed."""
    proc = self._daemons[f'slurmd-{node}']
    proc.kill()
    proc.wait()
    marks = {f'{NODE_VAR}={node}'.encode(), f'SLURMD_NODENAME={node}'.encode()}
    killed = 1
    for entry in os.listdir('/proc'):
      if not entry.isdigit() or int(entry) == os.getpid():
        continue
      try:
        with open(f'/proc/{entry}/environ', 'rb') as f:
          if marks & set(f.read().split(b'\0')):
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
      except OSError:
        continue
    return killed

  def job_state(self, job: int) -> str:
    """The job's state per `squeue` ('' once it left the queue)."""
    out = self.run(['squeue', '-h', '-j', str(job), '-o', '%T'], check=False)
    states = set(out.split())
    return ','.join(sorted(states))

  def close(self) -> None:
    """Stops the daemons (slurmds first: their jobs' processes go with them) and removes
    the cluster's dir."""
    order = sorted(self._daemons, key=lambda n: (not n.startswith('slurmd'),
                                                 n == 'munged'))
    for name in order:
      proc = self._daemons[name]
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
          proc.wait(15)
        except subprocess.TimeoutExpired:
          os.killpg(proc.pid, signal.SIGKILL)
          proc.wait()
    self._daemons.clear()
    if self.dir:
      shutil.rmtree(self.dir, ignore_errors=True)

  def __exit__(self, *exc) -> None:
    self.close()
