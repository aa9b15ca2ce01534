"""Runs Launchpad's Vertex AI executables without Vertex: every replica a local process.

Two launchers start a program this way, so the one implementation is here:
`vertex.py --emulate` (every replica on this host, loopback addresses: the Vertex path
tested without a cloud) and `cluster.py` (machines of your own: each host starts its
share of the replicas of one cluster spec). Neither is Vertex-specific beyond this:
Launchpad's Vertex executables are the only ones in Launchpad 0.5.0 that take their
peers' addresses from the environment (`CLUSTER_SPEC`) instead of picking them locally.

`build_pools` builds the pools' executables exactly as a Vertex launch does --
Launchpad's own `to_executables` per pool (`xm_docker.to_docker_executables`: `job.pkl`,
`process_entry.py` and a copy of the code directory) after binding every node's address
to the `CLUSTER_SPEC` Vertex would set -- and `run`, instead of building images and
submitting a job, starts `python -m process_entry --data_file=job.pkl` for each replica
this host runs, from its pool's copied directory, with a `CLUSTER_SPEC` of the given
addresses (by default loopback, one distinct port per node). A pickling problem, an
import that only works from the checkout or a second port per node fails here as it
would in the cloud.

The program is stopped the Vertex way's equivalent: the central node's program stopper
(`program_stopper`) signals the launcher on its host (SIGTERM), which passes SIGTERM to
every replica it started (Launchpad's worker manager in each sets the node's stop event)
and kills what is left after a grace period. A host without the central node stops its
replicas when the run's summary appears in the shared logdir. What this cannot show:
the image build, Vertex's DNS names, GCS, accelerators.
"""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Set, Tuple

import portpicker

from seedacme.run import logdir as logdir_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout's package directories: what a replica must import from its copy only.
PACKAGES = ('seedacme', 'agents', 'envs', 'launchers')
# Set in every replica's environment to the checkout's package dirs: `seedacme/__init__.py`
# then fails any import of a file under them (a replica must run from its copy only).
FORBIDDEN_SOURCE_ENV = 'SEEDACME_FORBIDDEN_SOURCE'


class BuiltPool(NamedTuple):
  """One pool's executable: where Launchpad put it and how a replica starts."""
  name: str
  directory: str  # holds job.pkl, process_entry.py and the copied code
  command: List[str]
  replicas: int
  container: object = None  # Launchpad's xm.PythonContainer (what a real job submits)
  requirements: object = None  # its xm.JobRequirements


def program_stopper() -> Callable[[], None]:
  """The central node's `stop_program` for these launches: SIGTERM to this launcher.

  Created in the launcher (it carries the launcher's pid) and pickled with the program;
  the central replica runs on the launcher's host, so the signal reaches it.
  """
  return functools.partial(os.kill, os.getpid(), signal.SIGTERM)


def missing_xmanager() -> str | None:
  """Why the executables cannot be built here (Launchpad needs xmanager), or None."""
  try:
    import xmanager  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return ('xmanager is not installed (Launchpad builds the executables with it): '
            '.venv/bin/pip install -r requirements/vertex.txt -c requirements/constraints.txt')
  return None


def build_pools(program, pools: Dict[str, List[str]], resources) -> List[BuiltPool]:
  """Binds addresses and builds each pool's executable as a Vertex launch would.

  Args:
    program: the Launchpad program.
    pools: pool name -> node labels (e.g. `['actor/0', 'actor/1']`), in pool order; a
      node's index in its pool is its replica index.
    resources: node group -> `lp.DockerConfig` (e.g. `vertex.xm_resources`).

  Returns:
    Each pool's executable, in the order of `pools`.
  """
  from launchpad import context as lp_context  # pylint: disable=g-import-not-at-top
  import stat  # pylint: disable=g-import-not-at-top
  from seedacme.runtime import owned_paths  # pylint: disable=g-import-not-at-top
  # Launchpad makes each executable with mkdtemp (0700) under the temp dir, and the
  # replicas run from there: a temp dir others can write into without the sticky bit
  # would let them rename ours away and put their own in its place.
  problem = owned_paths.base_problem(tempfile.gettempdir())
  if problem:
    raise owned_paths.UnsafePathError(f'refusing to build executables under {problem}')
  launch_type = lp_context.LaunchType.VERTEX_AI
  for label, nodes in program.groups.items():
    for node in nodes:
      node._initialize_context(launch_type, launch_config=resources[label])  # pylint: disable=protected-access
  for label, nodes in program.groups.items():
    for node in nodes:
      for handle in node.input_handles:
        handle.connect(node, label)
  built = []
  before = set(os.listdir(tempfile.gettempdir()))
  for pool, labels in pools.items():
    nodes = []
    for name in labels:
      label, index = name.split('/')
      nodes.append(program.groups[label][int(index)])
    for instance, node in enumerate(nodes):
      node.bind_addresses(cluster=pool, instance=instance)
    [(container, requirements)] = nodes[0].to_executables(nodes, pool,
                                                          nodes[0].launch_context)
    command = list(container.entrypoint.commands)[0].split()
    built.append(BuiltPool(pool, container.path, command, len(nodes), container,
                           requirements))
  # to_docker_executables draws temp dirs until one has no '_' and leaves the rejected
  # (empty) ones behind: remove those.
  # Only this user's: a shared temp dir holds other users' new dirs too.
  for name in set(os.listdir(tempfile.gettempdir())) - before:
    path = os.path.join(tempfile.gettempdir(), name)
    try:
      st = os.lstat(path)
      if '_' in name and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        os.rmdir(path)  # fails on a non-empty dir: only an empty one goes
    except OSError:
      pass
  return built


def parse_cluster_spec(text: str, replicas: Dict[str, int]) -> Dict[str, List[str]]:
  """`{pool: ['host:port', ...]}` from JSON or `@file`, checked against `replicas`.

  `replicas`: pool -> its number of replicas. Raises ValueError naming the problem.
  """
  if text.startswith('@'):
    try:
      with open(text[1:]) as f:
        text = f.read()
    except OSError as e:
      raise ValueError(f'--cluster_spec: cannot read {text[1:]}: {e.strerror}') from e
  try:
    hosts = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'--cluster_spec is not JSON: {e}') from e
  got = {k: len(v) for k, v in hosts.items()} if isinstance(hosts, dict) else None
  if got != replicas:
    raise ValueError(f'--cluster_spec must give {replicas} addresses per pool (see '
                     f'--dry_run), got {got}')
  for addresses in hosts.values():
    for address in addresses:
      host, _, port = str(address).rpartition(':')
      if not host or not port.isdigit():
        raise ValueError(f'--cluster_spec: {address!r} is not host:port')
  return hosts


def parse_replicas(text: str | None, replicas: Dict[str, int]) -> Set[Tuple[str, int]]:
  """{(pool, index)} this host starts: all of them by default, else 'pool/i,...'."""
  every = {(name, i) for name, count in replicas.items() for i in range(count)}
  if not text:
    return every
  mine = set()
  for item in text.split(','):
    name, _, index = item.strip().partition('/')
    if not index.isdigit() or (name, int(index)) not in every:
      names = ', '.join(f'{p}/{i}' for p, count in replicas.items() for i in range(count))
      raise ValueError(f'--replicas: {item!r} is not one of {names}')
    mine.add((name, int(index)))
  return mine


def cluster_spec(replicas: Dict[str, int],
                 hosts: Dict[str, List[str]] | None = None,
                 containers: bool = False) -> Dict[str, List[str]]:
  """`{pool: ['host:port', ...]}`: loopback and free ports unless `hosts` gives them;
  `containers`: each replica at an address of its own (127.0.1.k, `CONTAINER_NET`),
  as each replica of a Vertex job is a container of its own."""
  if hosts is not None:
    return hosts
  k = iter(range(1, 255))
  return {name: [f'{CONTAINER_NET + str(next(k)) if containers else "127.0.0.1"}:'
                 f'{portpicker.pick_unused_port()}' for _ in range(count)]
          for name, count in replicas.items()}


# The emulated containers' addresses (127.0.1.k) and their own loopbacks (127.0.2.k).
CONTAINER_NET, CONTAINER_LOOPBACK = '127.0.1.', '127.0.2.'


def default_log_dir(logdir: str) -> str:
  """Where replica logs go by default: `<logdir>/replicas`, or ./replicas for a bucket.

  A replica's output is a local file (the launcher opens it), so a `gs://` logdir
  cannot hold it.
  """
  if '://' in logdir:
    return os.path.abspath('replicas')
  return os.path.join(logdir, 'replicas')


def _mtime(path: str) -> float | None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    return tf.io.gfile.stat(path).mtime_nsec
  except tf.errors.NotFoundError:
    return None


class Replicas:
  """The replica processes this host runs; stops them all on SIGTERM/SIGINT or at exit."""

  def __init__(self, grace_s: float = 20.0, summary_path: str | None = None):
    self.procs: Dict[str, subprocess.Popen] = {}
    self._grace_s = grace_s
    self._stop = threading.Event()
    # A host without the central node learns that the run ended from its summary.
    self._summary_path = summary_path
    self._summary_before = _mtime(summary_path) if summary_path else None

  def start(self, pool: str, directory: str, command: List[str], index: int,
            cluster: Dict[str, List[str]], forbidden_source: str | None,
            log_dir: str, prefix: List[str] = (),
            environ: Dict[str, str] | None = None) -> None:
    """`environ`: the replica's base environment (default this process's)."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k not in ('PYTHONPATH',)}
    env['CLUSTER_SPEC'] = json.dumps({'cluster': cluster,
                                      'task': {'type': pool, 'index': index}})
    if forbidden_source:
      env[FORBIDDEN_SOURCE_ENV] = forbidden_source
    # The container's `python` is the image's; here, this interpreter (its packages).
    argv = [sys.executable if command[0] == 'python' else command[0], *command[1:]]
    from seedacme.runtime import owned_paths  # pylint: disable=g-import-not-at-top
    # This user's and not writable by others (or refused), and the log never opened
    # through a link: no one else can plant one where a replica's output goes.
    owned_paths.owned_dir(log_dir, 0o755, purpose='replica log dir', own_links=True)
    with owned_paths.open_nofollow(os.path.join(log_dir, f'{pool}-{index}')) as log:
      self.procs[f'{pool}/{index}'] = subprocess.Popen(
          [*prefix, *argv], cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)

  def request_stop(self, *_) -> None:
    self._stop.set()

  def stopping(self, timeout_s: float) -> bool:
    """Waits up to `timeout_s`; whether a stop was asked meanwhile."""
    return self._stop.wait(timeout_s)

  def wait(self, launcher: str = 'emulation') -> Dict[str, int]:
    """Until every replica ended (or a stop was asked); returns their exit codes."""
    while not self._stop.is_set():
      if all(p.poll() is not None for p in self.procs.values()):
        break
      if self._summary_path and _mtime(self._summary_path) != self._summary_before:
        print(f'{launcher}: the run wrote its summary; stopping this host\'s replicas',
              flush=True)
        time.sleep(3)  # let the central node's host stop first
        break
      failed = [n for n, p in self.procs.items() if p.poll() not in (None, 0)]
      if failed:
        print(f'{launcher}: replica {failed[0]} exited with code '
              f'{self.procs[failed[0]].returncode}; stopping the others', flush=True)
        break
      self._stop.wait(0.5)
    self.stop()
    return {n: p.returncode for n, p in self.procs.items()}

  def stop(self) -> None:
    for p in self.procs.values():
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + self._grace_s
    for p in self.procs.values():
      try:
        p.wait(max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def open_tunnel(spec: Dict[str, List[str]], mine: Set[Tuple[str, int]],
                every: Set[Tuple[str, int]], logdir: str, tls_dir: str | None,
                run_name: str, launcher: str, time_budget_s: float | None = None,
                mechanism: str = 'namespace'):
  """(tunnel, the cluster spec this host's replicas see, `ended`): a private namespace,
  and a mutual-TLS endpoint in front of it when replicas run elsewhere too.

  The credentials (`tls_tunnel.host_credentials`) cover what the run's clock has left
  of `time_budget_s` (None: no time budget). `ended()`, called once this host's
  replicas are done, removes the run's set from the logdir when this host runs the
  central node and the run wrote its summary meanwhile: the run ended (after a crash
  the set stays, so a relaunch rejoins the hosts still running with it).
  """
  from seedacme.run import monitor  # pylint: disable=g-import-not-at-top
  from seedacme.wire import tls_tunnel  # pylint: disable=g-import-not-at-top
  if mine == every:  # one host: loopback only, no one to authenticate
    return tls_tunnel.Tunnel(None, None, mechanism), spec, lambda: None
  plan, seen = tls_tunnel.plan(spec, mine)
  hosts = tls_tunnel.spec_hosts(spec)  # every host runs the same spec: one set for all
  central = ('learner', 0) in mine  # its host renews the run's set and removes it

  def mtime(path):
    try:
      return os.stat(path).st_mtime_ns
    except OSError:
      return None
  summary = os.path.join(logdir, logdir_lib.SUMMARY)
  summary_before = mtime(summary)
  needed_s = time_budget_s
  if needed_s is not None and '://' not in logdir:
    try:
      needed_s -= float(logdir_lib.read_json(os.path.join(logdir, monitor.RUN_CLOCK))
                        ['elapsed_s'])
    except (OSError, ValueError, TypeError, KeyError):
      pass  # a first start (no clock yet): the whole budget
  work = tempfile.mkdtemp(prefix='seedacme-tls-')
  try:
    creds = tls_tunnel.host_credentials(logdir, tls_dir, plan.address, run_name, work,
                                        hosts, needed_s, central)
    tunnel = tls_tunnel.Tunnel(plan, creds, mechanism)
  finally:
    shutil.rmtree(work, ignore_errors=True)  # the contexts hold the key now
  tls_root = os.path.join(logdir, tls_tunnel.TLS_DIR)
  where = ('in a private network namespace' if mechanism == 'namespace' else
           'on loopback (no namespace here; other uids refused at accept)')
  print(f'{launcher}: replicas {where}; mutual TLS on '
        f'{plan.address} ports {plan.inbound}; {len(plan.outbound)} peers through it '
        f'(credentials: {tls_dir or tls_tunnel.run_credentials_dir(tls_root, hosts)})',
        flush=True)

  def ended():
    if central and not tls_dir and mtime(summary) != summary_before and \
        tls_tunnel.remove_run_credentials(tls_root, hosts):
      print(f'{launcher}: the run ended; its TLS credentials removed from {tls_root}',
            flush=True)
  return tunnel, seen, ended


def run(program, pools: Dict[str, List[str]], resources, logdir: str,
        log_dir: str | None = None, hosts: Dict[str, List[str]] | None = None,
        mine: Set[Tuple[str, int]] | None = None, launcher: str = 'emulation',
        network: str = 'isolated', tls_dir: str | None = None,
        time_budget_s: float | None = None, job_store: str | None = None) -> int:
  """Builds the executables and runs this host's replicas until the program ends.

  Args:
    program: the Launchpad program, made with `stop_program=program_stopper()`.
    pools, resources: as for `build_pools`.
    logdir: the run's logdir (shared by the hosts when there are several).
    log_dir: where replica logs go (default: `default_log_dir(logdir)`).
    hosts: every replica's address (`parse_cluster_spec`); default: loopback.
    mine: the (pool, index) replicas this host starts (`parse_replicas`); default: all.
      When others run elsewhere, the run's summary appearing in `logdir` tells this
      host to stop its replicas (the central node's host is signalled by its stopper).
    launcher: the name printed before this function's lines.
    network: 'isolated' (default): this host's replicas run in one private network
      namespace with only loopback, and when other hosts take part, a mutual-TLS
      endpoint of the run is the only thing on this host's address
      (`seedacme.wire.tls_tunnel`); 'host': on the host's network, exposed.
    tls_dir: the user's own credentials (see `tls_tunnel.host_credentials`); default:
      the run's own in `<logdir>/tls`, removed when the run ends.
    time_budget_s: the run's time budget (`ProgramConfig.time_budget`): how long the
      run's credentials must last.
    job_store: a Vertex job's way (`seedacme.wire.replica_guard`): each replica is an
      emulated container (an address and a loopback of its own) whose entrypoint is
      the replica guard, authenticated with the job's credentials in this store
      (`tls_tunnel.issue_slot_credentials`, done by the caller), removed at the end.

  Returns:
    0 when every replica exited 0, else 1.
  """
  counts = {name: len(labels) for name, labels in pools.items()}
  every = parse_replicas(None, counts)
  mine = every if mine is None else mine
  built = build_pools(program, pools, resources)
  spec = cluster_spec(counts, hosts, containers=job_store is not None)
  tunnel, seen, ended = None, spec, lambda: None
  if job_store is not None:
    from seedacme.wire import tls_tunnel  # pylint: disable=g-import-not-at-top
    print(f'{launcher}: every replica an emulated container (its own address and '
          'loopback) behind the replica guard: servers on its loopback, mutual TLS on '
          f'its address (the job\'s credentials: {job_store})', flush=True)
    ended = functools.partial(tls_tunnel.remove_slot_credentials, job_store)
  elif network in ('isolated', 'loopback'):
    from seedacme.runtime import isolation  # pylint: disable=g-import-not-at-top
    from seedacme.wire import tls_tunnel  # pylint: disable=g-import-not-at-top
    # The strongest mechanism this host offers (issue 64): a private namespace, else
    # the replicas' servers kept on loopback, other uids refused at accept.
    chosen = isolation.choose_isolation(
        ('namespace', 'loopback') if network == 'isolated' else ('loopback',))
    if chosen.mechanism is None:
      print(f'{launcher}: cannot isolate the replicas ({chosen.reason}): they would '
            'listen unauthenticated on every interface; refusing', file=sys.stderr,
            flush=True)
      return 2
    print(f'{launcher}: isolation: {chosen.mechanism} ({chosen.reason})', flush=True)
    try:
      tunnel, seen, ended = open_tunnel(spec, mine, every, logdir, tls_dir, program.name,
                                        launcher, time_budget_s, chosen.mechanism)
    except tls_tunnel.TunnelError as e:
      print(f'{launcher}: {e}', file=sys.stderr, flush=True)
      return 2
  summary = os.path.join(logdir, logdir_lib.SUMMARY) if mine != every else None
  replicas = Replicas(summary_path=summary)
  signal.signal(signal.SIGTERM, replicas.request_stop)
  signal.signal(signal.SIGINT, replicas.request_stop)
  forbidden = os.pathsep.join(os.path.join(REPO_ROOT, n) for n in PACKAGES)
  log_dir = log_dir or default_log_dir(logdir)
  for pool in built:
    for index in range(pool.replicas):
      if (pool.name, index) in mine:
        command, environ = pool.command, tunnel.env(os.environ) if tunnel else None
        if job_store is not None:  # the container's entrypoint, as vertex.py submits it
          from seedacme.wire import replica_guard  # pylint: disable=g-import-not-at-top
          command = replica_guard.entrypoint(command)
          # Its loopback beside its address: 127.0.1.k -> 127.0.2.k.
          k = spec[pool.name][index].rpartition(':')[0].rpartition('.')[2]
          environ = dict(os.environ, **{replica_guard.LOOPBACK_ENV: CONTAINER_LOOPBACK + k})
        replicas.start(pool.name, pool.directory, command, index, seen, forbidden,
                       log_dir, tunnel.prefix() if tunnel else (), environ)
  print(f'{launcher}: {len(replicas.procs)} of {len(every)} replicas in {len(built)} pools '
        f'({", ".join(f"{b.name} x {b.replicas}" for b in built)}) on this host; '
        f'logs in {log_dir}', flush=True)
  exposed: List[str] = []
  if tunnel is not None and tunnel.mechanism == 'loopback':
    threading.Thread(target=_check_listeners, args=(replicas, launcher, exposed),
                     daemon=True).start()
  try:
    codes = replicas.wait(launcher)
  finally:
    if tunnel is not None:
      print(f'{launcher}: TLS endpoint {tunnel.counters.as_dict()}', flush=True)
      tunnel.close()
    ended()
  print(f'{launcher}: replicas ended: {codes}', flush=True)
  return 1 if exposed or any(c != 0 for c in codes.values()) else 0


def _check_listeners(replicas: Replicas, launcher: str, exposed: List[str],
                     settle_s: float = 30.0) -> None:
  """The loopback mechanism's check (issue 64): once the replicas' servers are up, what
  they listen on, read from the kernel; anything beyond loopback stops this host."""
  from seedacme.runtime import isolation  # pylint: disable=g-import-not-at-top
  if replicas.stopping(settle_s):
    return
  found = isolation.exposed_listeners([p.pid for p in replicas.procs.values()])
  if found:
    exposed.extend(found)
    print(f'{launcher}: replicas listen beyond loopback despite the interposer: '
          f'{", ".join(exposed)}; stopping them', file=sys.stderr, flush=True)
    replicas.request_stop()
