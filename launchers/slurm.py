"""`launchers/slurm`: a SEED program on a Slurm cluster, submitted as one job.

    python -m seedacme.launchers.slurm catch vtrace 4 8 --logdir /shared/runs/catch \\
        --partition gpu --gres gpu:1 --actor_partition cpu --actor_nodes 2 \\
        --time 2:00:00 [--seeds 0-4]

Writes a batch script and submits it with `sbatch`: one heterogeneous job whose
component 0 (one node, one task; the GPU when `--gres` asks for one) runs the replay and
the learner, and whose component 1 (`--actor_nodes` nodes, `--actor_tasks` tasks) runs
the actors, spread round-robin over its tasks, and the evaluator (on its last task).
Each task runs the cluster launcher (`launchers/cluster.py`) for its share of the
replicas, so everything the cluster launcher does (copied code, replicas as processes,
a private namespace and mutual TLS between hosts, the summary ending every host) holds
here unchanged. Nothing is written by hand: the batch step (`batch`, on the first node
of component 0) derives the cluster spec from the allocation -- each component's
nodelist expanded by `scontrol show hostnames`, each node's address the `NodeAddr`
Slurm itself reaches it at (its name on most clusters; on the test cluster each
emulated host's own address), each task's node from the allocation's tasks per node (block
distribution) -- and gives the job a block of ports chosen by its job id
(`job_ports`), which every task checks are free on its node before starting.

Stopping: `scancel` (and preemption, and the time limit) signals every process of the
job with SIGTERM, SIGKILL after the cluster's `KillWait` (30 s by default). The cluster
launchers stop their replicas as on Ctrl-C; the central node writes the summary and
the last checkpoint within ~10 s. The batch step, told by the same SIGTERM, then marks
the summary (`stopped_because` names the Slurm job; the `stop` kind stays
`stop_requested`). `--requeue`: a requeued or preempted job starts again with the same
job id, ports and logdir, and resumes from its checkpoint (the run's identity check and
its budgets across starts apply, as for any resume). Slurm holds a requeued job ~2
minutes; on the 22.05 test cluster a requeued het job then stayed pending until its
start time was updated (`scontrol update JobId=N StartTime=now`). When component 0's
task ends (the run ended, or failed) component 1's tasks get a minute to see the summary
and stop by themselves, and are then stopped. The sruns run `--kill-on-bad-exit=0`: an
actor task that fails takes only its actors (the run goes on, as with a lost host),
not the other tasks of its component. Heterogeneous jobs are scheduled by backfill
only: at its default 30 s `bf_interval` a het job waited ~25 s on an idle cluster.

Seeds: `--seeds 0-4` submits one heterogeneous job per seed (logdir `<logdir>/seed_<n>`),
not a job array: Slurm 22.05 refuses arrays of heterogeneous jobs (`sbatch --array=0-1`
of a `#SBATCH hetjob` script: "Invalid job array specification", checked on the test
cluster). `aggregate <logdir>` is `seedacme.run.sweeps`: the median and range of the
seeds' return at fixed env steps.

Why not xm-slurm (XManager's community Slurm backend, which Vertex's path could share):
its 0.3.0 (read for this) requires xmanager>=0.4.0, where Launchpad 0.5.0 pins 0.3.0; it
submits over SSH (asyncssh) from a workstation, and runs each job as a container image
(Docker built, run by Apptainer), where this launcher runs the checkout's own
interpreter on a shared filesystem from a login node. A batch script an admin can read
was the smaller dependency. The checkout and its `.venv` must be at the same path on
every node, as the logdir (or the logdir a `gs://` bucket).

Other users of the cluster (issue 62): each task runs from a temp dir it makes anew
(mkdir, 0700, an unguessable name) under a $TMPDIR only the user can write into, or
root's sticky /tmp, never under a name another user could make first; the logdir, its
`slurm` dir and the job's files are the user's and not writable by others, or the
launcher refuses naming their owner; and no value holding a control character (a
newline would end an #SBATCH line) is written into the batch script.

Why one module of ~700 lines: the submitting side, the batch step and the tasks are
three processes of one protocol -- the plan file one writes and the others read.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import Dict, Iterable, List, Sequence, Tuple

from seedacme.runtime import owned_paths

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Ports for a job's replicas: a block of `count` in [low, high) chosen by the job id, so
# two jobs on a node collide only when their ids are a multiple of the blocks apart (and
# then the tasks' check says so).
PORT_RANGE = (20000, 32000)
# How long component 1 may take to see the summary after component 0 ended.
ACTORS_GRACE_S = 60.0
# How long the batch step waits for the central node's summary after the scheduler's
# SIGTERM (it writes it within ~10 s; KillWait is 30 s by default).
SUMMARY_WAIT_S = 25.0
SLURM_DIR = 'slurm'  # under the logdir: scripts, specs, plans, Slurm output, replica logs
# The flags the Slurm launcher sets on the cluster launcher itself.
OWNED = ('--cluster_spec', '--replicas', '--replica_logs', '--json')
# What would end or break a line of the sbatch script (issue 62, item 7): C0 and C1
# control characters, DEL, and Unicode's line and paragraph separators.
_CONTROL = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029]')


def _slurm_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog='launchers/slurm', description=__doc__.split('\n')[0], allow_abbrev=False,
      formatter_class=argparse.ArgumentDefaultsHelpFormatter, add_help=False,
      epilog='Every other flag is a program flag of launchers/cluster (below), passed '
      'to each task. Subcommands: aggregate <logdir> (a seed sweep\'s table and curve).')
  p.add_argument('-h', '--help', action='store_true')
  p.add_argument('--logdir', default=None,
                 help='absolute path of a directory every node sees (or gs://...); '
                 'with --seeds, each seed runs in <logdir>/seed_<n>')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--seeds', default=None,
                 help='a sweep: 0-4, 0,3,7 or 1-3,9; one job per seed')
  p.add_argument('--partition', default=None,
                 help="both components' partition (the learner's, with --actor_partition)")
  p.add_argument('--actor_partition', default=None,
                 help="component 1's partition (default: --partition), e.g. a CPU "
                 'partition where --partition is the GPU one')
  p.add_argument('--account', default=None)
  p.add_argument('--time', default=None, help="the job's time limit (Slurm's format)")
  p.add_argument('--gres', default=None,
                 help="the learner's generic resources, e.g. gpu:1 (then the central "
                 'node refuses to start without a GPU)')
  p.add_argument('--learner_cpus', type=int, default=1,
                 help='CPUs of the replay + learner task')
  p.add_argument('--actor_nodes', type=int, default=1, help='nodes of component 1')
  p.add_argument('--actor_tasks', type=int, default=0,
                 help='tasks (cluster launchers) of component 1; 0: one per node')
  p.add_argument('--actor_cpus', type=int, default=1, help='CPUs of each actor task')
  p.add_argument('--requeue', action='store_true',
                 help='let Slurm requeue the job (preemption, node failure); it resumes '
                 'from its checkpoint in the same logdir')
  p.add_argument('--job_name', default=None, help='default: seedacme-<env>-<agent>')
  p.add_argument('--sbatch_arg', action='append', default=[], metavar='ARG',
                 help='one more sbatch option for both components, e.g. '
                 '--sbatch_arg=--mem=8G (repeatable; write it with "=")')
  p.add_argument('--port_range', default=f'{PORT_RANGE[0]}-{PORT_RANGE[1]}',
                 help="where the job's ports are drawn from")
  p.add_argument('--dry_run', action='store_true',
                 help='print the batch script; submit nothing')
  return p


def parse_args(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str], object]:
  """(Slurm flags, the program flags to forward, the program flags as parsed).

  Exits with usage (status 2) on a bad flag, as argparse does."""
  from seedacme.launchers import cluster  # pylint: disable=g-import-not-at-top
  parser = _slurm_parser()
  args, rest = parser.parse_known_args(argv)
  if args.help:
    parser.print_help()
    print('\nprogram flags (launchers/cluster):')
    try:
      cluster.parse_args(['--help'])
    except SystemExit:
      pass
    sys.exit(0)
  for flag, value in script_values(args, rest):
    problem = control_problem(flag, value)
    if problem:
      parser.error(problem)
  owned = [f for f in rest if f.split('=')[0] in OWNED or f in ('--dry_run',)]
  if owned:
    parser.error(f'{", ".join(owned)}: set by the Slurm launcher from the allocation')
  if not args.logdir:
    parser.error('--logdir is required: a directory every node sees')
  if '://' not in args.logdir and not os.path.isabs(args.logdir):
    parser.error(f'--logdir {args.logdir!r} must be absolute (the same path on every '
                 'node), or gs:// with --network host')
  if args.actor_nodes < 1 or args.actor_tasks < 0 or \
      (args.actor_tasks and args.actor_tasks < args.actor_nodes):
    parser.error('--actor_nodes >= 1 and --actor_tasks 0 (one per node) or >= the nodes')
  program = cluster.parse_args([*rest, '--logdir', args.logdir, '--seed', str(args.seed)])
  problem = cluster.bucket_problem(program.network, args.logdir)
  if problem:
    parser.error(problem)
  try:
    args.seed_list = parse_seeds(args.seeds) if args.seeds else [args.seed]
    args.ports = parse_range(args.port_range)
  except ValueError as e:
    parser.error(str(e))
  return args, rest, program


def control_problem(name: str, value: str) -> str | None:
  """Why `value` (of flag `name`) cannot go into the sbatch script, or None: a control
  character would end its #SBATCH line or the command (shlex.quote keeps a newline)."""
  m = _CONTROL.search(value)
  if m is None:
    return None
  name = name if not _CONTROL.search(name) else repr(name)
  return (f'{name} {value!r}: control character {m.group()!r} (U+{ord(m.group()):04X}) '
          f'at position {m.start()}; a value written into the sbatch script cannot hold '
          'one (it would end a line of the script)')


def script_values(args: argparse.Namespace,
                  forward: Sequence[str]) -> Iterable[Tuple[str, str]]:
  """(flag, value) of everything the batch script is written from: the Slurm flags
  and the forwarded program flags (a value named by its flag)."""
  for flag in ('job_name', 'logdir', 'seeds', 'partition', 'actor_partition', 'account',
               'time', 'gres', 'port_range'):
    value = getattr(args, flag, None)
    if value is not None:
      yield f'--{flag}', str(value)
  for value in getattr(args, 'sbatch_arg', None) or []:
    yield '--sbatch_arg', value
  for i, value in enumerate(forward):
    before = forward[i - 1] if i else ''
    if value.startswith('-'):
      name = value.split('=')[0]
    elif before.startswith('-') and '=' not in before:
      name = before
    else:
      name = f'program argument {i + 1}'
    yield name, value


def parse_seeds(text: str) -> List[int]:
  """'0-4' -> [0..4]; '0,3,7'; '1-3,9'. Sorted, without repeats."""
  seeds = set()
  for part in text.split(','):
    part = part.strip()
    m = re.fullmatch(r'(\d+)(?:-(\d+))?', part)
    if not m:
      raise ValueError(f'--seeds: {part!r} is not N or N-M')
    low, high = int(m.group(1)), int(m.group(2) or m.group(1))
    if high < low:
      raise ValueError(f'--seeds: {part!r} runs backwards')
    seeds.update(range(low, high + 1))
  return sorted(seeds)


def parse_range(text: str) -> Tuple[int, int]:
  m = re.fullmatch(r'(\d+)-(\d+)', text.strip())
  if not m or not 1024 <= int(m.group(1)) < int(m.group(2)) <= 65536:
    raise ValueError(f'--port_range: {text!r} is not LOW-HIGH within 1024-65536')
  return int(m.group(1)), int(m.group(2))


def replica_counts(num_actors: int, num_eval_envs: int) -> Dict[str, int]:
  """The program's node groups (`seedacme.nodes.program`): its pools."""
  counts = {'replay': 1, 'learner': 1, 'actor': num_actors}
  if num_eval_envs:
    counts['evaluator'] = 1
  return counts


def assign_replicas(counts: Dict[str, int], actor_tasks: int) -> List[List[List[str]]]:
  """Per component, per task, its replicas: component 0's one task the replay and the
  learner; component 1's tasks the actors round-robin, the evaluator on the last."""
  tasks: List[List[str]] = [[] for _ in range(actor_tasks)]
  for i in range(counts['actor']):
    tasks[i % actor_tasks].append(f'actor/{i}')
  if counts.get('evaluator'):
    tasks[-1].append('evaluator/0')
  return [[['replay/0', 'learner/0']], tasks]


def tasks_per_node(text: str) -> List[int]:
  """Slurm's SLURM_TASKS_PER_NODE ('2(x3),1') -> [2, 2, 2, 1]."""
  out = []
  for part in text.split(','):
    m = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
    if not m:
      raise ValueError(f'cannot read tasks per node {text!r}')
    out.extend([int(m.group(1))] * int(m.group(2) or 1))
  return out


def task_hosts(addresses: Sequence[str], per_node: Sequence[int]) -> List[str]:
  """Each task's node address under block distribution (srun --distribution=block)."""
  if len(addresses) != len(per_node):
    raise ValueError(f'{len(addresses)} nodes but tasks per node for {len(per_node)}')
  return [a for a, n in zip(addresses, per_node) for _ in range(n)]


def job_ports(job_id: int, count: int, ports: Tuple[int, int] = PORT_RANGE) -> List[int]:
  """`count` consecutive ports for the job: block `job_id mod blocks` of the range."""
  low, high = ports
  blocks = (high - low) // count
  if blocks < 1:
    raise ValueError(f'the port range {low}-{high} holds fewer than {count} ports')
  start = low + (job_id % blocks) * count
  return list(range(start, start + count))


def derive_spec(counts: Dict[str, int], assignment: List[List[List[str]]],
                hosts: List[List[str]], ports: List[int]) -> Dict[str, List[str]]:
  """The cluster spec: each replica at its task's host and its own port of the block."""
  where = {}
  for component, tasks in enumerate(assignment):
    if len(tasks) != len(hosts[component]):
      raise ValueError(f'component {component}: {len(tasks)} tasks planned, '
                       f'{len(hosts[component])} allocated')
    for task, replicas in enumerate(tasks):
      for replica in replicas:
        where[replica] = hosts[component][task]
  spec, k = {}, 0
  for pool, count in counts.items():
    spec[pool] = []
    for i in range(count):
      spec[pool].append(f'{where[f"{pool}/{i}"]}:{ports[k]}')
      k += 1
  return spec


def busy_ports(host_ports: Sequence[int]) -> List[int]:
  """The ports here that cannot be bound (another job, another program)."""
  busy = []
  for port in host_ports:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        s.bind(('', port))
      except OSError:
        busy.append(port)
  return busy


# ---- The batch script -------------------------------------------------------------

def seed_logdir(logdir: str, seed: int, sweep: bool) -> str:
  return f'{logdir.rstrip("/")}/seed_{seed}' if sweep else logdir


def batch_script(args: argparse.Namespace, forward: List[str], logdir: str, seed: int,
                 job_name: str, python: str = sys.executable) -> str:
  """The sbatch script of one run: two components, then the batch step (`batch`).

  Raises ValueError naming the value when one holds a control character (`parse_args`
  refuses those first; this holds for callers that skip it)."""
  values = [*script_values(args, forward), ('--job_name', job_name), ('--logdir', logdir),
            ('the interpreter', python), ('the checkout', REPO_ROOT)]
  for name, value in values:
    problem = control_problem(name, value)
    if problem:
      raise ValueError(problem)
  local = '://' not in logdir
  out = os.path.join(logdir, SLURM_DIR, 'slurm-%j.out') if local else \
      os.path.abspath(f'{job_name}-%j.out')
  common = [f'--job-name={job_name}', f'--output={out}', '--open-mode=append',
            '--requeue' if args.requeue else '--no-requeue']
  # Each component takes these afresh after `hetjob`.
  both = [f'--{k}={v}' for k, v in (('account', args.account), ('time', args.time)) if v]
  both += args.sbatch_arg
  learner = ['--nodes=1', '--ntasks=1', f'--cpus-per-task={args.learner_cpus}']
  if args.gres:
    learner.append(f'--gres={args.gres}')
  actor_tasks = args.actor_tasks or args.actor_nodes
  actors = [f'--nodes={args.actor_nodes}', f'--ntasks={actor_tasks}',
            f'--cpus-per-task={args.actor_cpus}']
  # --partition is both components', unless --actor_partition gives component 1 its own.
  for component, partition in ((learner, args.partition),
                               (actors, args.actor_partition or args.partition)):
    if partition:
      component.insert(0, f'--partition={partition}')
  run = [python, '-m', 'seedacme.launchers.slurm', 'batch', '--logdir', logdir,
         '--seed', str(seed), '--actor_tasks', str(actor_tasks),
         '--port_range', args.port_range, *(['--gres', args.gres] if args.gres else []),
         '--', *forward]
  lines = ['#!/bin/bash',
           *[f'#SBATCH {shlex.quote(o)}' for o in common + both + learner],
           '#SBATCH hetjob',
           *[f'#SBATCH {shlex.quote(o)}' for o in both + actors],
           '# Written by launchers/slurm.py: component 0 runs replay/0 and learner/0,',
           '# component 1 the actors and the evaluator. The batch step derives the cluster',
           '# spec from the allocation and starts one srun per component.',
           f'cd {shlex.quote(REPO_ROOT)}',
           f'exec {" ".join(shlex.quote(a) for a in run)}', '']
  broken = [line for line in lines if _CONTROL.search(line)]
  if broken:  # every value was checked above: a value this function forgot
    raise ValueError(f'a line of the sbatch script holds a control character: '
                     f'{broken[0]!r}')
  return '\n'.join(lines)


def owned_subdir(root: str, *parts: str) -> str:
  """`root/parts...`: the logdir (or the job's working dir) and each level below it
  made (0755 under the umask) or checked to be this user's and not writable by others;
  `UnsafePathError` names a path someone else made (`owned_paths.owned_dir`)."""
  path = owned_paths.owned_dir(root, 0o755, purpose='logdir', own_links=True)
  for part in parts:
    path = owned_paths.owned_dir(os.path.join(path, part), 0o755, purpose='logdir')
  return path


def submit(script: str, env: Dict[str, str] | None = None) -> int:
  """`sbatch --parsable` of the script; the job id."""
  done = subprocess.run(['sbatch', '--parsable'], input=script, text=True,
                        capture_output=True, env=env, check=False)
  if done.returncode != 0:
    raise RuntimeError(f'sbatch failed: {done.stderr.strip() or done.stdout.strip()}')
  return int(done.stdout.strip().split(';')[0].split('+')[0])


def submit_main(argv: Sequence[str]) -> int:
  args, rest, program = parse_args(argv)
  forward = [a for a in rest]
  sweep = args.seeds is not None
  job_name = args.job_name or f'seedacme-{program.env}-{program.agent}'
  jobs = []
  for seed in args.seed_list:
    logdir = seed_logdir(args.logdir, seed, sweep)
    name = f'{job_name}-seed{seed}' if sweep else job_name
    script = batch_script(args, forward, logdir, seed, name)
    if args.dry_run:
      print(f'# seed {seed}: logdir {logdir}\n{script}')
      continue
    if '://' not in logdir:
      try:
        slurm_dir = owned_subdir(args.logdir, *([f'seed_{seed}'] if sweep else []),
                                 SLURM_DIR)
        owned_paths.replace_file(os.path.join(slurm_dir, 'batch.sh'), script)
      except (owned_paths.UnsafePathError, OSError) as e:
        print(f'slurm: {e}', file=sys.stderr)
        return 2
    try:
      job = submit(script)
    except (RuntimeError, FileNotFoundError) as e:
      print(f'slurm: {e}', file=sys.stderr)
      return 1
    jobs.append((job, seed, logdir))
    print(f'slurm: submitted job {job} (seed {seed}), logdir {logdir}', flush=True)
  if args.dry_run:
    print('slurm: dry run: nothing submitted')
    return 0
  ids = ','.join(str(j) for j, _, _ in jobs)
  first = jobs[0][2]
  progress = os.path.join(first, 'progress.jsonl') if len(jobs) == 1 else \
      os.path.join(args.logdir, 'seed_*', 'progress.jsonl')
  output = os.path.join(first if len(jobs) == 1 else os.path.join(args.logdir, 'seed_*'),
                        SLURM_DIR, 'slurm-<job>.out')
  print(f'follow: squeue -j {ids}    progress: tail -F {progress}\n'
        f'        Slurm output: {output}    stop: scancel {ids.replace(",", " ")}')
  if sweep:
    print(f'        when done: python -m seedacme.launchers.slurm aggregate {args.logdir}')
  return 0


# ---- Inside the job ---------------------------------------------------------------

def scontrol_hostnames(nodelist: str) -> List[str]:
  out = subprocess.run(['scontrol', 'show', 'hostnames', nodelist], capture_output=True,
                       text=True, check=True).stdout
  return out.split()


def node_address(scontrol_node: str) -> str | None:
  """NodeAddr from one `scontrol show node -o <name>` line."""
  m = re.search(r'\bNodeAddr=(\S+)', scontrol_node)
  return m.group(1) if m else None


def scontrol_addresses(names: Sequence[str]) -> List[str]:
  out = []
  for name in names:
    line = subprocess.run(['scontrol', 'show', 'node', '-o', name], capture_output=True,
                          text=True, check=True).stdout
    out.append(node_address(line) or name)
  return out


def allocation_hosts(environ: Dict[str, str], hostnames=scontrol_hostnames,
                     addresses=scontrol_addresses) -> List[List[str]]:
  """Per component, each task's node address, from the batch step's environment."""
  hosts = []
  for component in (0, 1):
    nodelist = environ.get(f'SLURM_JOB_NODELIST_HET_GROUP_{component}')
    per_node = environ.get(f'SLURM_TASKS_PER_NODE_HET_GROUP_{component}')
    if not nodelist or not per_node:
      raise ValueError(f'not in a heterogeneous Slurm job (no SLURM_JOB_NODELIST_HET_'
                       f'GROUP_{component}): submit with launchers/slurm')
    hosts.append(task_hosts(addresses(hostnames(nodelist)), tasks_per_node(per_node)))
  return hosts


def mark_summary(summary: Dict, job_id: str, restarts: str) -> Dict:
  """The summary of a run the scheduler stopped, saying so (the kind stays)."""
  if summary.get('stop', {}).get('kind') != 'stop_requested':
    return summary
  out = dict(summary)
  out['stopped_because'] = (f'stop requested by Slurm: job {job_id} was signalled '
                            '(scancel, preemption or its time limit)')
  out['stop'] = {**summary['stop'], 'detail': f'slurm job {job_id} SIGTERM'}
  out['scheduler'] = {'name': 'slurm', 'job_id': job_id, 'restart_count': int(restarts)}
  return out


def _mtime(path: str) -> int | None:
  try:
    return os.stat(path).st_mtime_ns
  except OSError:
    return None


def batch_main(argv: Sequence[str]) -> int:
  """The batch step: cluster spec and plan from the allocation, one srun per component."""
  from seedacme.run import logdir as logdir_lib  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(prog='launchers/slurm batch')
  for flag in ('--logdir', '--seed', '--actor_tasks', '--port_range', '--gres'):
    p.add_argument(flag)
  p.add_argument('forward', nargs=argparse.REMAINDER)
  args = p.parse_args(argv)
  forward = [a for a in args.forward if a != '--']
  from seedacme.launchers import cluster  # pylint: disable=g-import-not-at-top
  program = cluster.parse_args([*forward, '--logdir', args.logdir])
  env = dict(os.environ)
  job = env.get('SLURM_JOB_ID', '')
  restarts = env.get('SLURM_RESTART_COUNT', '0')
  counts = replica_counts(program.num_actors, program.num_eval_envs)
  assignment = assign_replicas(counts, int(args.actor_tasks))
  try:
    hosts = allocation_hosts(env)
    ports = job_ports(int(job), sum(counts.values()), parse_range(args.port_range))
    spec = derive_spec(counts, assignment, hosts, ports)
  except (ValueError, subprocess.CalledProcessError) as e:
    print(f'slurm batch: {e}', file=sys.stderr)
    return 2
  local = '://' not in args.logdir
  # The job's files: on the shared logdir, or (a bucket) in the job's working dir.
  try:
    jobdir = owned_subdir(args.logdir if local else os.getcwd(), SLURM_DIR, f'job-{job}')
  except (owned_paths.UnsafePathError, OSError) as e:
    print(f'slurm batch: {e}', file=sys.stderr)
    return 2
  nodes = allocation_hosts(env, addresses=list)  # each task's node name, for people
  plan = {'job': job, 'restart_count': int(restarts), 'spec': spec, 'tasks': assignment,
          'hosts': hosts, 'nodes': nodes, 'forward': [*forward, '--logdir', args.logdir, '--seed',
                                      args.seed] +
          (['--accelerator', 'gpu'] if args.gres and 'gpu' in args.gres and
           '--accelerator' not in forward else [])}
  plan_file = os.path.join(jobdir, f'plan-{restarts}.json')
  owned_paths.replace_file(plan_file, json.dumps(plan, indent=1))
  print(f'slurm batch: job {job} (start {int(restarts) + 1}): cluster spec '
        f'{json.dumps(spec)}', flush=True)

  signalled = threading.Event()
  summary_path = os.path.join(args.logdir, logdir_lib.SUMMARY)
  summary_before = _mtime(summary_path) if local else None

  def on_term(*_):
    signalled.set()
  signal.signal(signal.SIGTERM, on_term)
  signal.signal(signal.SIGINT, on_term)
  steps = []
  for component in (0, 1):
    steps.append(subprocess.Popen(
        ['srun', f'--het-group={component}', '--distribution=block', '--kill-on-bad-exit=0',
         f'--job-name=seedacme-{"learner" if component == 0 else "actors"}',
         sys.executable, '-m', 'seedacme.launchers.slurm', 'task', plan_file,
         str(component)], start_new_session=True))
  # Component 0 ends the run; component 1 then has ACTORS_GRACE_S to see the summary.
  while steps[0].poll() is None and not signalled.is_set():
    time.sleep(0.5)
  if signalled.is_set():
    deadline = time.monotonic() + SUMMARY_WAIT_S
    while local and time.monotonic() < deadline and \
        _mtime(summary_path) in (None, summary_before):
      time.sleep(0.2)
    summary = logdir_lib.read_summary(args.logdir) if local else None
    if summary is not None and _mtime(summary_path) != summary_before:
      logdir_lib.write_json(summary_path, mark_summary(summary, job, restarts))
      print(f'slurm batch: job {job} stopped by the scheduler; summary marked', flush=True)
  deadline = time.monotonic() + ACTORS_GRACE_S
  while steps[1].poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)
  for step in steps:
    if step.poll() is None:
      step.send_signal(signal.SIGTERM)  # srun passes it to its tasks
  codes = [step.wait() for step in steps]
  print(f'slurm batch: steps ended with {codes}', flush=True)
  return codes[0]


TASK_TMP_PREFIX = 'seedacme-slurm-'


def remove_stale_task_dirs(base: str, alive=None) -> List[str]:
  """Removes the temp dirs of tasks that ended without removing theirs (SIGKILLed: a
  lost node's slurmstepd, a KillWait exceeded): a dir of this user's whose `pid` file
  names a process that no longer runs. Each task sweeps its node's on start, so at most
  one task's dir outlives it per node until the next task there. Never a symlink, nor
  anything another uid made (however it is named). Returns the dirs removed."""
  alive = alive or (lambda pid: os.path.exists(f'/proc/{pid}'))
  removed = []
  try:
    names = [n for n in os.listdir(base) if n.startswith(TASK_TMP_PREFIX)]
  except OSError:
    return removed
  for name in names:
    path = os.path.join(base, name)
    try:
      st = os.lstat(path)
      if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        continue  # a symlink, a file, or not ours: leave it
      fd = os.open(os.path.join(path, 'pid'), os.O_RDONLY | os.O_NOFOLLOW)
      with os.fdopen(fd) as f:
        pid = int(f.read().strip())
      if alive(pid):
        continue
    except (OSError, ValueError):
      continue  # no pid file yet (a task starting): leave it
    shutil.rmtree(path, ignore_errors=True)  # never follows a link inside
    removed.append(path)
  return removed


def task_temp_base(environ: Dict[str, str]) -> Tuple[str | None, List[str]]:
  """(where a task makes its temp dir, why the places before it were passed over):
  $TMPDIR, else /tmp; the first without '_' (Launchpad 0.5.0's executables need that)
  that only this user can write into, or that is root's and sticky (/tmp)."""
  passed = []
  for base in dict.fromkeys([environ.get('TMPDIR') or '/tmp', '/tmp']):
    problem = (f'{base} contains "_" (Launchpad 0.5.0 cannot build there)' if '_' in base
               else owned_paths.base_problem(base))
    if problem is None:
      return base, passed
    passed.append(problem)
  return None, passed


def make_task_dir(environ: Dict[str, str], job: str, component: int, task: int,
                  note=lambda text: None) -> str:
  """The task's own temp dir (the pools' copied code is built and run there):
  `<base>/seedacme-slurm-<job>-<component>-<task>-<16 hex digits>`, made anew (mkdir,
  0700; no '_', which Launchpad 0.5.0's executables need) under a base no one else can
  replace it in (`task_temp_base`), with its `pid` file (for `remove_stale_task_dirs`).
  Never a name another user of the node could make first (issue 62: a planted dir or
  `pid` symlink). Raises `UnsafePathError` when no base will do; `note` hears why
  $TMPDIR was passed over."""
  base, passed = task_temp_base(environ)
  if base is None:
    raise owned_paths.UnsafePathError(
        f'no temp dir only this user can write into: {"; ".join(passed)}. Set TMPDIR '
        'to a directory of your own without "_"')
  if passed:
    note(f'temp dir under {base}, not {passed[0]}')
  remove_stale_task_dirs(base)
  tmp = owned_paths.private_tempdir(base, f'{TASK_TMP_PREFIX}{job}-{component}-{task}-')
  owned_paths.write_private(os.path.join(tmp, 'pid'), str(os.getpid()))
  return tmp


def task_main(argv: Sequence[str]) -> int:
  """One srun task: this task's replicas through the cluster launcher."""
  plan_file, component = argv[0], int(argv[1])
  with open(plan_file) as f:
    plan = json.load(f)
  task = int(os.environ['SLURM_PROCID'])
  replicas = plan['tasks'][component][task]
  if not replicas:
    print(f'slurm task {component}.{task}: no replicas (more tasks than actors)')
    return 0
  spec = plan['spec']
  mine = []
  for replica in replicas:
    pool, index = replica.split('/')
    mine.append(int(spec[pool][int(index)].rpartition(':')[2]))
  node = os.environ.get('SLURMD_NODENAME', socket.gethostname())
  busy = busy_ports(mine)
  if busy:
    print(f'slurm task {component}.{task}: ports {busy} of job {plan["job"]} are in use on '
          f'{node} (another job\'s block, or another program); resubmit, or choose '
          '--port_range', file=sys.stderr, flush=True)
    return 1
  jobdir = os.path.dirname(plan_file)
  spec_file = os.path.join(jobdir, 'cluster_spec.json')
  if not os.path.exists(spec_file):
    try:
      owned_paths.replace_file(spec_file, json.dumps(spec))
    except OSError:
      pass
  where = f'slurm task {component}.{task} on {node}'
  try:
    tmp = make_task_dir(os.environ, plan['job'], component, task,
                        note=lambda text: print(f'{where}: {text}', flush=True))
  except (owned_paths.UnsafePathError, OSError) as e:
    print(f'{where}: {e}', file=sys.stderr, flush=True)
    return 2
  env = dict(os.environ, TMPDIR=tmp)
  command = [sys.executable, '-m', 'seedacme.launchers.cluster', *plan['forward'],
             '--cluster_spec', json.dumps(spec), '--replicas', ','.join(replicas),
             '--replica_logs', os.path.join(jobdir, f'replicas-{plan["restart_count"]}')]
  print(f'slurm task {component}.{task} on {node}: {",".join(replicas)}', flush=True)
  child = subprocess.Popen(command, env=env, cwd=REPO_ROOT)

  def forward(signum, _):
    if child.poll() is None:
      child.send_signal(signum)
  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)
  try:
    return child.wait()
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  from seedacme.run import sweeps  # pylint: disable=g-import-not-at-top
  commands = {'aggregate': sweeps.main, 'batch': batch_main, 'task': task_main}
  if argv and argv[0] in commands:
    return commands[argv[0]](argv[1:])
  return submit_main(argv)


if __name__ == '__main__':
  sys.exit(main())
