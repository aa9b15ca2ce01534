"""Runs the Vertex AI executables without Vertex: every replica a local process.

`vertex.py --emulate` builds the worker pools' executables exactly as a Vertex launch
does -- Launchpad's own `to_executables` per pool (`xm_docker.to_docker_executables`:
`job.pkl`, `process_entry.py` and a copy of the code directory) after binding every
node's address to the `CLUSTER_SPEC` Vertex would set -- and then, instead of building
images and submitting a job, starts `python -m process_entry --data_file=job.pkl` for
every replica, from that pool's copied directory, with a `CLUSTER_SPEC` of loopback
addresses (one distinct port per node). A pickling problem, an import that only works
from the checkout or a second port per node fails here as it would in the cloud.

The program is stopped the Vertex way's equivalent: the central node's program stopper
signals this launcher (SIGTERM), which passes SIGTERM to every replica (Launchpad's
worker manager in each sets the node's stop event) and kills what is left after a grace
period. What this cannot show: the image build, Vertex's DNS names, GCS, accelerators.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Sequence, Tuple

import portpicker

# Set in every replica's environment to the checkout's path: `seedacme/__init__.py` then
# fails any import of a file under it (an emulated replica must run from its copy only).
FORBIDDEN_SOURCE_ENV = 'SEEDACME_FORBIDDEN_SOURCE'


def build_pools(program, pools, xm_resources) -> List[Tuple[str, str, List[str], int]]:
  """Binds addresses and builds each pool's executable as a Vertex launch would.

  Args:
    program: the Launchpad program.
    pools: `vertex.WorkerPool`s in Vertex order (`vertex.plan_worker_pools`).
    xm_resources: group -> `lp.DockerConfig` (`vertex._xm_resources`).

  Returns:
    (pool name, directory holding job.pkl and the code, command, replicas) per pool.
  """
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  from launchpad import context as lp_context  # pylint: disable=g-import-not-at-top
  launch_type = lp_context.LaunchType.VERTEX_AI
  del lp
  for label, nodes in program.groups.items():
    for node in nodes:
      node._initialize_context(launch_type, launch_config=xm_resources[label])  # pylint: disable=protected-access
  for label, nodes in program.groups.items():
    for node in nodes:
      for handle in node.input_handles:
        handle.connect(node, label)
  built = []
  before = set(os.listdir(tempfile.gettempdir()))
  for pool in pools:
    nodes = []
    for name in pool.nodes:
      label, index = name.split('/')
      nodes.append(program.groups[label][int(index)])
    for instance, node in enumerate(nodes):
      node.bind_addresses(cluster=pool.name, instance=instance)
    [(container, _)] = nodes[0].to_executables(nodes, pool.name, nodes[0].launch_context)
    command = list(container.entrypoint.commands)[0].split()
    built.append((pool.name, container.path, command, len(nodes)))
  # to_docker_executables draws temp dirs until one has no '_' and leaves the rejected
  # (empty) ones behind: remove those.
  for name in set(os.listdir(tempfile.gettempdir())) - before:
    path = os.path.join(tempfile.gettempdir(), name)
    if '_' in name and os.path.isdir(path) and not os.listdir(path):
      os.rmdir(path)
  return built


def parse_cluster_spec(text: str, pools) -> Dict[str, List[str]]:
  """`{pool: ['host:port', ...]}` from JSON or `@file`, checked against the pools."""
  if text.startswith('@'):
    with open(text[1:]) as f:
      text = f.read()
  try:
    hosts = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'--cluster_spec is not JSON: {e}') from e
  expected = {name: replicas for name, _, _, replicas in pools}
  got = {k: len(v) for k, v in hosts.items()} if isinstance(hosts, dict) else None
  if got != expected:
    raise ValueError(f'--cluster_spec must give {expected} addresses per pool (see '
                     f'--dry_run), got {got}')
  for addresses in hosts.values():
    for address in addresses:
      host, _, port = address.rpartition(':')
      if not host or not port.isdigit():
        raise ValueError(f'--cluster_spec: {address!r} is not host:port')
  return hosts


def parse_replicas(text: str | None, pools) -> set:
  """{(pool, index)} this host starts: all of them by default, else 'pool/i,...'."""
  every = {(name, i) for name, _, _, replicas in pools for i in range(replicas)}
  if not text:
    return every
  mine = set()
  for item in text.split(','):
    name, _, index = item.strip().partition('/')
    if not index.isdigit() or (name, int(index)) not in every:
      raise ValueError(f'--replicas: {item!r} is not one of {sorted(every)}')
    mine.add((name, int(index)))
  return mine


def cluster_spec(pools: Sequence[Tuple[str, str, List[str], int]],
                 hosts: Dict[str, List[str]] | None = None) -> Dict[str, List[str]]:
  """`{pool: ['host:port', ...]}`: loopback and free ports unless `hosts` gives them."""
  if hosts is not None:
    return hosts
  return {name: [f'127.0.0.1:{portpicker.pick_unused_port()}' for _ in range(replicas)]
          for name, _, _, replicas in pools}


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
            log_dir: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH',)}
    env['CLUSTER_SPEC'] = json.dumps({'cluster': cluster,
                                      'task': {'type': pool, 'index': index}})
    if forbidden_source:
      env[FORBIDDEN_SOURCE_ENV] = forbidden_source
    # The container's `python` is the image's; here, this interpreter (its packages).
    argv = [sys.executable if command[0] == 'python' else command[0], *command[1:]]
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f'{pool}-{index}'), 'w') as log:
      self.procs[f'{pool}/{index}'] = subprocess.Popen(
          argv, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)

  def request_stop(self, *_) -> None:
    self._stop.set()

  def wait(self) -> Dict[str, int]:
    """Until every replica ended (or a stop was asked); returns their exit codes."""
    while not self._stop.is_set():
      if all(p.poll() is not None for p in self.procs.values()):
        break
      if self._summary_path and _mtime(self._summary_path) != self._summary_before:
        print('cluster: the run wrote its summary; stopping this host\'s replicas', flush=True)
        time.sleep(3)  # let the central node's host stop first
        break
      failed = [n for n, p in self.procs.items() if p.poll() not in (None, 0)]
      if failed:
        print(f'cluster: replica {failed[0]} exited with code '
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
