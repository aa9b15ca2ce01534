"""`launchers/vertex`: the same SEED program as a distributed Vertex AI job.

    python -m seedacme.launchers.vertex atari vtrace 64 --accelerator V100 --dry_run

Launchpad 0.5.0 launches `vertex_ai` programs through xmanager (optional extra:
`pip install -r requirements/vertex.txt -c requirements/constraints.txt`). Every node
group becomes a `python:3.10` image (Launchpad's fixed base: the launching Python's
version) built from this repository and a requirements file: `requirements/lock.txt`,
plus `requirements/vertex_gpu.txt` (CUDA 11 / cuDNN 8 wheels, `seedacme/runtime/cuda_libs.py`)
for a GPU learner. Nodes with identical hardware and requirements share a worker pool.
Vertex AI allows at most 4 worker pools and the first must have exactly one replica.

`--dry_run` needs no xmanager and no cloud credentials: it builds the real program,
derives the job plan exactly as Launchpad will (pools, replicas, images, hardware),
validates it and prints it. Without `--dry_run` it also checks the GCP setup
(GOOGLE_CLOUD_BUCKET_NAME, credentials) and launches. `--emulate` builds the same
executables and runs every replica on this host instead (`launchers/emulation.py`): the
Vertex path tested without a cloud. Machines of your own have their own entry point,
`launchers/cluster.py`, which runs on the same emulation.

Authenticated by default (issue 64): a container cannot make a network namespace, so
every replica's entrypoint is `seedacme.wire.replica_guard` in front of Launchpad's:
Courier and Reverb on the container's loopback (the loopback interposer), the run's
mutual-TLS endpoint on the replica's address. The credentials are issued here at
submission -- a CA in memory, its key never written, one leaf per replica slot -- into
a store the job's replicas read (`--credentials`: default
gs://$GOOGLE_CLOUD_BUCKET_NAME/seedacme-credentials/<job>/, readable by who can read that
bucket; the emulation: a private directory in the logdir), and removed when the run
ends. `--network host` is the opt-out: no guard, the VPC as the only boundary.
"""

import argparse
import atexit
import collections
import dataclasses
import json
import os
import secrets
import shutil
import sys
import tempfile
from typing import Dict, List, Sequence, Tuple

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme import envs
from seedacme.launchers import emulation
from seedacme.launchers.program_flags import ProgramArgsError, add_program_args, make_program_inputs
from seedacme.runtime import owned_paths

REPO_ROOT = emulation.REPO_ROOT
# Launchpad 0.5.0's `to_docker_executables` builds on python:<the launching Python>.
BASE_IMAGE = f'python:{sys.version_info.major}.{sys.version_info.minor}'
LOCK = os.path.join(REPO_ROOT, 'requirements', 'lock.txt')
GPU_REQUIREMENTS = os.path.join(REPO_ROOT, 'requirements', 'vertex_gpu.txt')
MAX_WORKER_POOLS = 4
GPUS = ('T4', 'P4', 'P100', 'V100', 'A100', 'L4')
TPUS = ('TPU_V2', 'TPU_V3')


@dataclasses.dataclass(frozen=True)
class Hardware:
  """What one node of a group gets."""
  cpu: int
  memory_gb: int
  accelerator: str | None = None
  accelerator_count: int = 0

  def describe(self) -> str:
    acc = f' + {self.accelerator_count} x {self.accelerator}' if self.accelerator else ''
    return f'{self.cpu} vCPU, {self.memory_gb} GiB{acc}'


@dataclasses.dataclass
class WorkerPool:
  """One Vertex AI worker pool: replicas sharing an image and hardware."""
  name: str
  nodes: List[str]  # node labels, e.g. ['actor/0', 'actor/1', ...]
  hardware: Hardware
  image: str
  requirements: Tuple[str, ...]  # files installed in order (one file for Launchpad)
  code_directory: str

  @property
  def replicas(self) -> int:
    return len(self.nodes)

  def groups(self) -> Dict[str, int]:
    return dict(collections.Counter(n.split('/')[0] for n in self.nodes))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog='launchers/vertex', description=__doc__.split('\n')[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_program_args(p, envs_per_actor=32, max_seconds=24 * 3600.0,
                   logdir_help='default: gs://$GOOGLE_CLOUD_BUCKET_NAME/seedacme/<env>_<agent>',
                   standby_restarts=True)
  p.add_argument('--dry_run', action='store_true',
                 help='build, validate and print the job plan; launch nothing')
  p.add_argument('--accelerator', default='V100', choices=('none',) + GPUS + TPUS,
                 help='accelerator of the central inference/learner node')
  p.add_argument('--accelerator_count', type=int, default=1)
  p.add_argument('--learner_cpu', type=int, default=8)
  p.add_argument('--learner_memory_gb', type=int, default=32)
  p.add_argument('--actor_cpu', type=int, default=4)
  p.add_argument('--actor_memory_gb', type=int, default=8)
  p.add_argument('--replay_cpu', type=int, default=4)
  p.add_argument('--replay_memory_gb', type=int, default=0,
                 help='0: sized from the replay table (see replay_memory_gb())')
  p.add_argument('--json', action='store_true', help='print the plan as JSON')
  p.add_argument('--network', choices=('isolated', 'host'), default='isolated',
                 help='isolated (default): every replica behind the replica guard '
                 '(servers on its loopback, mutual TLS on its address); host: no guard, '
                 "Courier and Reverb unauthenticated on the job's VPC (see VPC_EXPOSURE)")
  p.add_argument('--credentials', default=None,
                 help='where the job\'s credentials go at submission (a gs:// prefix its '
                 'replicas can read; default gs://$GOOGLE_CLOUD_BUCKET_NAME/'
                 'seedacme-credentials/<job>); --emulate: <logdir>/tls/job-<id>')
  p.add_argument('--emulate', action='store_true',
                 help='build the real Vertex executables and run every replica as a local '
                 'process from its copied code, with a loopback CLUSTER_SPEC '
                 '(launchers/emulation.py); needs xmanager, no cloud')
  p.add_argument('--emulate_logs', default=None,
                 help='--emulate: where replica logs go (default <logdir>/replicas)')
  # Moved to the own-machines launcher; kept (hidden) to say so instead of "unrecognized".
  p.add_argument('--cluster_spec', default=None, help=argparse.SUPPRESS)
  p.add_argument('--replicas', default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


MOVED_TO_CLUSTER = ('vertex: --cluster_spec and --replicas (a run across your own machines) '
                    'moved to `python -m seedacme.launchers.cluster <env> <agent> ... '
                    '--cluster_spec ... --replicas ...` (same program flags; see its '
                    '--dry_run); `vertex --emulate` alone runs every replica on this host')


# What `--network host` leaves open: said when it is asked for.
VPC_EXPOSURE = (
    "the job's replicas serve Courier and Reverb unauthenticated on the job's VPC "
    "network: anything that reaches a replica's port there can send inference requests "
    'and reports, and read, write or reset the replay')


def replay_memory_gb(builder, spec: envs.EnvSpec) -> int:
  """Enough memory for a full replay table (items x bytes per item), x2 + 4 GiB slack."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  items, steps = builder.replay_capacity()
  frame = int(np.prod(spec.observation_shape)) * spec.dtype.itemsize
  item_bytes = steps * (frame + 64) + 4096
  return int(2 * items * item_bytes / 2**30) + 4


def group_hardware(args: argparse.Namespace, replay_gb: int) -> Dict[str, Hardware]:
  """Hardware per node group: the accelerator goes to the central node only."""
  accelerator = None if args.accelerator == 'none' else args.accelerator
  actor = Hardware(args.actor_cpu, args.actor_memory_gb)
  return {
      'learner': Hardware(args.learner_cpu, args.learner_memory_gb, accelerator,
                          args.accelerator_count if accelerator else 0),
      'replay': Hardware(args.replay_cpu, args.replay_memory_gb or replay_gb),
      'actor': actor,
      'evaluator': actor,
  }


def group_requirements(hardware: Dict[str, Hardware]) -> Dict[str, Tuple[str, ...]]:
  """Requirements files per node group: the lock; a GPU's group adds the CUDA wheels."""
  return {label: (LOCK, GPU_REQUIREMENTS) if hw.accelerator in GPUS else (LOCK,)
          for label, hw in hardware.items()}


def plan_worker_pools(groups: Dict[str, int], hardware: Dict[str, Hardware],
                      requirements: Dict[str, Tuple[str, ...]] | str,
                      code_directory: str) -> List[WorkerPool]:
  """Worker pools as Launchpad's vertex_ai launch forms them.

  Nodes whose (code, requirements, hardware) match share a pool, in program order;
  the first pool with a single node moves to the front; if the first pool still has
  several nodes, its first node is split off into a pool of its own. `requirements`:
  files per group (`group_requirements`), or one file for every group.
  """
  if isinstance(requirements, str):
    requirements = {label: (requirements,) for label in groups}
  by_container: Dict[Tuple[Hardware, Tuple[str, ...]], List[str]] = collections.OrderedDict()
  for label, count in groups.items():
    key = (hardware[label], requirements[label])
    by_container.setdefault(key, []).extend(f'{label}/{i}' for i in range(count))
  pools = list(by_container.items())
  for index, (_, nodes) in enumerate(pools):
    if len(nodes) == 1:
      pools.insert(0, pools.pop(index))
      break
  if len(pools[0][1]) != 1:
    key, nodes = pools[0]
    pools[0] = (key, nodes[:1])
    pools.append((key, nodes[1:]))
  return [WorkerPool(f'workerpool{i}', nodes, hw, BASE_IMAGE, reqs, code_directory)
          for i, ((hw, reqs), nodes) in enumerate(pools)]


def validate_plan(pools: List[WorkerPool]) -> List[str]:
  """Everything Vertex AI or Launchpad would reject, as messages (empty: valid)."""
  errors = []
  if len(pools) > MAX_WORKER_POOLS:
    errors.append(f'{len(pools)} worker pools; Vertex AI allows at most {MAX_WORKER_POOLS} '
                  '(give more node groups the same hardware)')
  if pools and pools[0].replicas != 1:
    errors.append(f'the first worker pool has {pools[0].replicas} replicas; it must have 1')
  for pool in pools:
    hw = pool.hardware
    for path in pool.requirements:
      if not os.path.isfile(path):
        errors.append(f'{pool.name}: requirements file {path} does not exist')
    if not os.path.isfile(os.path.join(pool.code_directory, 'setup.py')):
      errors.append(f'{pool.name}: code directory {pool.code_directory} has no setup.py')
    if hw.cpu < 1 or hw.memory_gb < 1:
      errors.append(f'{pool.name}: needs at least 1 vCPU and 1 GiB, got {hw.describe()}')
    if hw.accelerator and hw.accelerator not in GPUS + TPUS:
      errors.append(f'{pool.name}: unknown accelerator {hw.accelerator!r}')
    if hw.accelerator and hw.accelerator_count < 1:
      errors.append(f'{pool.name}: accelerator {hw.accelerator} with count {hw.accelerator_count}')
    groups = pool.groups()
    if hw.accelerator and set(groups) != {'learner'}:
      errors.append(f'{pool.name}: accelerator shared by {sorted(groups)}; only the '
                    'central inference/learner node should hold one')
    if hw.accelerator in TPUS and hw.accelerator_count not in (8,):
      errors.append(f'{pool.name}: Vertex AI TPU workers come as 8 cores, got '
                    f'{hw.accelerator_count}')
  if not any('learner' in p.groups() for p in pools):
    errors.append('no worker pool runs the central inference/learner node')
  return errors


def format_plan(pools: List[WorkerPool]) -> str:
  lines = [f'{"pool":<12} {"replicas":>8}  {"groups":<40} {"hardware":<34} image + requirements']
  for p in pools:
    groups = ', '.join(f'{g} x{n}' for g, n in p.groups().items())
    files = ' + '.join(os.path.relpath(r, REPO_ROOT) for r in p.requirements)
    lines.append(f'{p.name:<12} {p.replicas:>8}  {groups:<40} {p.hardware.describe():<34} '
                 f'{p.image} + {files}')
  return '\n'.join(lines)


def docker_requirements(pool: WorkerPool, directory: str) -> str:
  """The one requirements file Launchpad copies into `pool`'s image.

  Launchpad installs it alone (`pip install -r requirements.txt` before the code is
  copied), so an `-r` include would not resolve: several files are joined into
  `directory/<pool>.txt`.
  """
  if len(pool.requirements) == 1:
    return pool.requirements[0]
  path = os.path.join(directory, f'{pool.name}.txt')
  with open(path, 'w') as out:
    for source in pool.requirements:
      with open(source) as f:
        out.write(f'# {os.path.relpath(source, REPO_ROOT)}\n{f.read().rstrip()}\n')
  return path


def xm_resources(pools: List[WorkerPool]) -> Dict[str, object]:
  """Node group -> the `lp.DockerConfig` Launchpad builds its pool's image from.

  The pool's code directory, its one requirements file (`docker_requirements`) and its
  hardware as an `xm.JobRequirements`; needs xmanager (requirements/vertex.txt).
  """
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  from xmanager import xm  # pylint: disable=g-import-not-at-top
  joined = owned_paths.private_tempdir(prefix='seedacmereqs')
  atexit.register(shutil.rmtree, joined, ignore_errors=True)
  resources = {}
  for pool in pools:
    hw = pool.hardware
    accel = {hw.accelerator: hw.accelerator_count} if hw.accelerator else {}
    requirements = xm.JobRequirements(cpu=hw.cpu, memory=hw.memory_gb * xm.GiB, **accel)
    docker_file = docker_requirements(pool, joined)
    for group in pool.groups():
      resources[group] = lp.DockerConfig(pool.code_directory, docker_file, requirements,
                                         python_path=[pool.code_directory])
  return resources


# What a container needs of the repository: the package, its mapped subpackages and the
# files setup.py reads. Not the virtualenv, runs, .git or caches (Launchpad copies the
# whole code directory into every image).
CODE = emulation.PACKAGES + ('setup.py', 'requirements')


def stage_code_directory() -> str:
  """A temp dir with only the code a container needs (removed at exit): 0700 under a
  temp dir no other user can replace it in (`UnsafePathError` otherwise)."""
  staged = owned_paths.private_tempdir(prefix='seedacmecode')
  atexit.register(shutil.rmtree, staged, ignore_errors=True)
  for name in CODE:
    src = os.path.join(REPO_ROOT, name)
    if os.path.isdir(src):
      shutil.copytree(src, os.path.join(staged, name),
                      ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    elif os.path.exists(src):
      shutil.copy(src, staged)
  return staged


def temp_dir_error() -> str | None:
  """Why Launchpad cannot build executables under this temp dir, or None.

  Launchpad 0.5.0's `to_docker_executables` draws temp dirs until one has no '_'
  (Vertex rejects it): under a TMPDIR containing '_' it would loop forever. The staged
  code and the executables are run from there, so the temp dir must also be one no
  other user can replace them in: this user's and not writable by others, or root's
  and sticky (/tmp) (`owned_paths.base_problem`).
  """
  base = tempfile.gettempdir()
  if '_' in base:
    return (f'the temp dir {base!r} contains "_", which Launchpad 0.5.0 cannot use for '
            'Vertex executables; set TMPDIR to a path without "_"')
  problem = owned_paths.base_problem(base)
  if problem:
    return (f'the temp dir {problem}: other users could replace the code run from it; '
            'set TMPDIR to a directory of your own')
  return None


def check_cloud_setup() -> List[str]:
  problems = []
  if not os.environ.get('GOOGLE_CLOUD_BUCKET_NAME'):
    problems.append('set GOOGLE_CLOUD_BUCKET_NAME to a GCS bucket for job files and logs')
  xmanager = emulation.missing_xmanager()
  if xmanager:
    problems.append(xmanager)
  try:
    import google.auth  # pylint: disable=g-import-not-at-top
    google.auth.default()
  except Exception:  # pylint: disable=broad-except
    problems.append('no Google Cloud credentials: gcloud auth application-default login')
  return problems


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.cluster_spec or args.replicas:
    print(MOVED_TO_CLUSTER, file=sys.stderr)
    return 2
  if args.network == 'host' and not args.dry_run:
    print(f'vertex: --network host: {VPC_EXPOSURE}', file=sys.stderr)
  if args.emulate and args.network != 'host' and args.transport == 'auto':
    # Each replica is a machine of its own on Vertex: shared memory is never offered
    # between them. The emulated containers share a kernel, so say it here.
    args.transport = 'courier'
    print('vertex --emulate: --transport courier (replicas are separate machines)')
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top

  bucket = os.environ.get('GOOGLE_CLOUD_BUCKET_NAME', '<bucket>')
  logdir = args.logdir or f'gs://{bucket}/seedacme/{args.env}_{args.agent}'
  if args.emulate and '://' not in logdir:
    logdir = os.path.abspath(logdir)  # the replicas run from their copied directories
  try:
    factory, spec, builder, config = make_program_inputs(
        args, logdir, accelerator=None if args.accelerator == 'none' else args.accelerator)
  except ProgramArgsError as e:
    print(f'vertex: {e}', file=sys.stderr)
    return 2
  launch_type = lp.LaunchType.VERTEX_AI
  if args.emulate:
    # The central node's stopper signals this launcher, which stops every replica.
    stop_program = emulation.program_stopper()
  else:
    stop_program = None if args.dry_run else lp.make_program_stopper(launch_type)
  program = program_lib.make_program(builder, factory, spec, config, stop_program=stop_program,
                                     name=f'seedacme-{args.env}-{args.agent}')
  groups = {label: len(nodes) for label, nodes in program.groups.items()}
  problem = None if args.dry_run else temp_dir_error()
  if problem:
    print(f'vertex: {problem}', file=sys.stderr)
    return 2
  code_directory = REPO_ROOT if args.dry_run else stage_code_directory()
  hardware = group_hardware(args, replay_memory_gb(builder, spec))
  pools = plan_worker_pools(groups, hardware, group_requirements(hardware), code_directory)
  errors = validate_plan(pools)
  if args.json:
    print(json.dumps({'program': program.name, 'logdir': logdir, 'valid': not errors,
                      'errors': errors,
                      'worker_pools': [dict(name=p.name, replicas=p.replicas, groups=p.groups(),
                                            hardware=dataclasses.asdict(p.hardware),
                                            image=p.image, requirements=list(p.requirements))
                                       for p in pools]}, indent=1))
  else:
    print(f'Vertex AI job plan for {program.name} ({sum(groups.values())} nodes, '
          f'logdir {logdir}):')
    print(format_plan(pools))
    for e in errors:
      print(f'INVALID: {e}', file=sys.stderr)
  if errors:
    return 1
  if args.dry_run:
    if not args.json:
      print('vertex: plan is valid (dry run: nothing launched)')
    return 0
  if args.emulate:
    problem = emulation.missing_xmanager()
    if problem:
      print(f'vertex: {problem}', file=sys.stderr)
      return 2
    store = None
    if args.network != 'host':
      store = args.credentials or os.path.join(
          owned_paths.private_dir(os.path.join(logdir, 'tls'), 'TLS directory'),
          f'job-{secrets.token_hex(6)}')
      if not issue_job_credentials(pools, store, program.name, config.time_budget,
                                   code_directory):
        return 2
    return emulation.run(program, {p.name: p.nodes for p in pools}, xm_resources(pools),
                         logdir, args.emulate_logs, launcher='vertex --emulate',
                         network='host' if store is None else 'isolated', job_store=store)
  problems = check_cloud_setup()
  if problems:
    print('vertex: cannot launch:\n  ' + '\n  '.join(problems), file=sys.stderr)
    return 2
  if args.network == 'host':
    lp.launch(program, launch_type=launch_type, xm_resources=xm_resources(pools))
    return 0
  store = args.credentials or (f'gs://{bucket}/seedacme-credentials/'
                               f'{program.name}-{secrets.token_hex(6)}')
  if not issue_job_credentials(pools, store, program.name, config.time_budget,
                               code_directory):
    return 2
  submit_guarded(program, pools, xm_resources(pools))
  print(f'vertex: every replica behind the replica guard; the job\'s credentials in '
        f'{store} (removed by the central node\'s replica when the run ends)')
  return 0


def central_slot(pools: List[WorkerPool]) -> str:
  """The worker pool slot ('workerpool0/0') that runs the central node (learner/0)."""
  for pool in pools:
    if 'learner/0' in pool.nodes:
      return f'{pool.name}/{pool.nodes.index("learner/0")}'
  raise ValueError('no pool runs learner/0')


def issue_job_credentials(pools: List[WorkerPool], store: str, run_name: str,
                          budget_s: float | None, code_directory: str) -> bool:
  """The job's credentials into `store` and its manifest into the staged code (what
  every replica's guard reads); False, having said why, if they cannot be."""
  from seedacme.wire import replica_guard, tls_tunnel  # pylint: disable=g-import-not-at-top
  try:
    tls_tunnel.issue_slot_credentials(store, {p.name: p.replicas for p in pools}, run_name,
                                      budget_s)
  except (tls_tunnel.TunnelError, OSError) as e:
    print(f'vertex: cannot issue the job\'s credentials into {store}: {e}', file=sys.stderr)
    return False
  replica_guard.write_manifest(code_directory, store, run_name, central_slot(pools),
                               budget_s)
  return True


def submit_guarded(program, pools: List[WorkerPool], resources) -> None:
  """Submits the job as Launchpad's vertex_ai launch does (the same pools, images and
  addresses: `emulation.build_pools`), each container's entrypoint with the replica
  guard in front (`replica_guard.entrypoint`)."""
  from xmanager import xm  # pylint: disable=g-import-not-at-top
  from xmanager import xm_local  # pylint: disable=g-import-not-at-top
  from seedacme.wire import replica_guard  # pylint: disable=g-import-not-at-top
  built = emulation.build_pools(program, {p.name: p.nodes for p in pools}, resources)
  with xm_local.create_experiment(experiment_title=program.name) as experiment:
    jobs = {}
    for i, pool in enumerate(built):
      c = pool.container
      guarded = xm.PythonContainer(
          entrypoint=xm.CommandList([' '.join(replica_guard.entrypoint(pool.command))]),
          path=c.path, base_image=c.base_image, docker_instructions=c.docker_instructions,
          use_deep_module=c.use_deep_module)
      [executable] = experiment.package([xm.Packageable(
          executable_spec=guarded, executor_spec=xm_local.Caip.Spec())])
      jobs[str(i + 1)] = xm.Job(executable=executable,
                                executor=xm_local.Caip(requirements=pool.requirements))
    experiment.add(xm.JobGroup(**jobs))


if __name__ == '__main__':
  sys.exit(main())
