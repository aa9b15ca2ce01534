"""What every benchmark script shares: launching real programs and reading what they did.

`ProgramRun` starts `seedacme.launchers.local` as a subprocess (a real multi-process
Launchpad program), tails its progress records as they arrive (with the wall-clock time
since launch), samples every node's RSS, and after the run reports the exit code, the
summary and any process left behind. `env_ceiling` measures how fast the same envs step
with random actions and no inference, in the same number of processes.
"""

import atexit
import json
import math
import multiprocessing
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from typing import Any, Dict, List

import numpy as np
import psutil

from seedacme.run import logdir as logdir_lib
from seedacme.launchers import process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, 'bench', 'results')
TAG_VAR = 'SEEDACME_BENCH_TAG'


def tagged_processes(tag: str, var: str = TAG_VAR) -> List[psutil.Process]:
  """Live processes whose environment carries `var=tag`."""
  out = []
  needle = f'{var}={tag}'.encode()
  for p in psutil.process_iter(['pid']):
    try:
      with open(f'/proc/{p.pid}/environ', 'rb') as f:
        if needle in f.read().split(b'\0') and p.status() != psutil.STATUS_ZOMBIE:
          out.append(p)
    except (OSError, psutil.Error):
      continue
  return out


def node_processes(tag: str, nodes_dir: str, var: str = TAG_VAR):
  """(process, node) for every live process of the run whose stdout is a node's log."""
  for p in tagged_processes(tag, var):
    try:
      out = os.readlink(f'/proc/{p.pid}/fd/1')
    except OSError:
      continue
    if out.startswith(nodes_dir):
      yield p, out[len(nodes_dir):]


def rss_by_node(tag: str, nodes_dir: str, var: str = TAG_VAR) -> Dict[str, float]:
  """RSS (MB) per node (`actor/0`, ...): the sum of its processes (supervisor + child)."""
  rss: Dict[str, float] = {}
  for p, node in node_processes(tag, nodes_dir, var):
    try:
      rss[node] = rss.get(node, 0.0) + p.memory_info().rss / 2**20
    except psutil.Error:
      continue
  return rss


def cpu_by_process(tag: str, nodes_dir: str, var: str = TAG_VAR) -> Dict[int, tuple]:
  """pid -> (node, CPU seconds used so far, user + system) for every live node process."""
  cpu: Dict[int, tuple] = {}
  for p, node in node_processes(tag, nodes_dir, var):
    try:
      times = p.cpu_times()
    except psutil.Error:
      continue
    cpu[p.pid] = (node, times.user + times.system)
  return cpu


def machine() -> Dict[str, Any]:
  """What the numbers were measured on."""
  cpu = platform.processor() or 'unknown'
  try:
    with open('/proc/cpuinfo') as f:
      names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return {'cpu': cpu, 'cores': os.cpu_count(),
          'memory_gib': round(psutil.virtual_memory().total / 2**30, 1),
          'gpu': bool(os.environ.get('CUDA_VISIBLE_DEVICES')), 'python': platform.python_version(),
          'date': time.strftime('%Y-%m-%d %H:%M')}


def git(*args: str, checkout: str = REPO) -> str:
  return subprocess.run(['git', *args], cwd=checkout, capture_output=True,
                        text=True).stdout.strip()


def commit(checkout: str = REPO) -> Dict[str, Any]:
  """The checkout's commit, and whether tracked files differ from it."""
  return {'commit': git('rev-parse', 'HEAD', checkout=checkout),
          'worktree_dirty': bool(git('status', '--porcelain', '--untracked-files=no',
                                     checkout=checkout))}


class ProgramRun:
  """One `run_local` program, watched from outside."""

  def __init__(self, args: List[str], name: str, workdir: str | None = None,
               env: Dict[str, str] | None = None):
    self.name = name
    self.env = dict(env or {})  # added to the program's environment
    self.tag = uuid.uuid4().hex
    # A workdir of our own (logs, logdir) is removed when the bench exits if the run
    # ended cleanly; one that failed is kept, and named, to read its logs.
    self._own_workdir = workdir is None
    self.workdir = workdir or tempfile.mkdtemp(prefix=f'seedacme_bench_{name}_')
    self.logdir = os.path.join(self.workdir, 'logdir')
    self.args = list(args) + ['--logdir', self.logdir, '--checkpoint_interval_s', '0']
    self.records: List[Dict[str, Any]] = []
    self.peak_rss: Dict[str, float] = {}
    self.peak_total_rss = 0.0
    self.first_learner_step_s: float | None = None
    self.first_env_step_s: float | None = None
    # (program clock of the newest progress record, wall clock, CPU s per node so far):
    # a process that exits keeps its last reading, so the sums never fall.
    self.cpu_samples: List[tuple] = []
    self._cpu_seen: Dict[int, tuple] = {}

  def run(self, timeout_s: float) -> Dict[str, Any]:
    """Runs the program to its end (or kills it at `timeout_s`); returns what it did."""
    nodes_dir = os.path.join(self.logdir, 'nodes') + os.sep
    offset = 0
    start = time.monotonic()
    with open(os.path.join(self.workdir, 'stdout.txt'), 'w') as out:
      proc = process.start([*self.args, '--progress_interval_s', '1'], None, out,
                           env={**self.env, TAG_VAR: self.tag}, cwd=REPO)
      timed_out = False
      while proc.poll() is None:
        time.sleep(0.5)
        now = time.monotonic() - start
        if now > timeout_s:
          timed_out = True
          os.killpg(proc.pid, signal.SIGINT)
          try:
            proc.wait(30)
          except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
          break
        rss = rss_by_node(self.tag, nodes_dir)
        for node, mb in rss.items():
          self.peak_rss[node] = max(self.peak_rss.get(node, 0.0), mb)
        self.peak_total_rss = max(self.peak_total_rss, sum(rss.values()))
        offset = self._read_progress(offset, now)
        if self.records and self.records[-1].get('env_steps'):
          last = self.records[-1]
          self._cpu_seen.update(cpu_by_process(self.tag, nodes_dir))
          per_node: Dict[str, float] = {}
          for node, seconds in self._cpu_seen.values():
            per_node[node] = per_node.get(node, 0.0) + seconds
          self.cpu_samples.append((last['elapsed_s'], now, per_node))
      code = proc.wait()
    self._read_progress(offset, time.monotonic() - start)
    time.sleep(2)
    leftovers = [p.pid for p in tagged_processes(self.tag)]
    for pid in leftovers:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    summary = logdir_lib.read_summary(self.logdir) or {}
    self.release_workdir(clean=code == 0 and not timed_out and not leftovers)
    return {'exit_code': code, 'timed_out': timed_out, 'leftovers': leftovers,
            'summary': summary, 'wall_s': time.monotonic() - start,
            'load_1m_at_end': os.getloadavg()[0]}

  def release_workdir(self, clean: bool) -> None:
    """A workdir this run made itself goes when the bench exits after a clean run; kept
    and named otherwise (the logs are the evidence)."""
    if not self._own_workdir:
      return
    if clean:
      atexit.register(shutil.rmtree, self.workdir, ignore_errors=True)
    else:
      print(f'{self.name}: logs kept in {self.workdir}', flush=True)

  def _read_progress(self, offset: int, now: float) -> int:
    records, offset = logdir_lib.tail_lines(self.logdir, offset)
    for record in records:
      if 'event' in record:
        continue
      record['wall_s'] = now
      self.records.append(record)
      if self.first_env_step_s is None and record.get('env_steps'):
        self.first_env_step_s = now
      if self.first_learner_step_s is None and record.get('learner_steps'):
        self.first_learner_step_s = now
    return offset

  def steady_rate(self, key: str = 'env_steps', skip_s: float = 5.0) -> float:
    """`key` per second between the first record `skip_s` after it started moving and
    the last record (the program's own clock)."""
    moving = [r for r in self.records if r.get(key)]
    if len(moving) < 2:
      return float('nan')
    t0 = moving[0]['elapsed_s'] + skip_s
    window = [r for r in moving if r['elapsed_s'] >= t0]
    if len(window) < 2:
      window = moving
    first, last = window[0], window[-1]
    dt = last['elapsed_s'] - first['elapsed_s']
    return (last[key] - first[key]) / dt if dt > 0 else float('nan')

  def cpu_us_per_step(self, group: str, skip_s: float = 5.0) -> float:
    """CPU microseconds a node group (all its nodes) spent per env step: its CPU rate
    over the steady window (from `skip_s` after env steps began) over `steady_rate`."""
    if not self.cpu_samples:
      return float('nan')
    # Up to the last record before the final one: the final record comes with shutdown.
    final = self.cpu_samples[-1][0]
    samples = [s for s in self.cpu_samples if s[0] < final] or self.cpu_samples
    window = [s for s in samples if s[0] >= samples[0][0] + skip_s]
    if len(window) < 2:
      window = samples
    if len(window) < 2 or window[-1][1] <= window[0][1]:
      return float('nan')
    def total(sample):
      return sum(v for node, v in sample[2].items() if node.split('/')[0] == group)
    cpu_per_s = (total(window[-1]) - total(window[0])) / (window[-1][1] - window[0][1])
    rate = self.steady_rate('env_steps', skip_s)
    return cpu_per_s / rate * 1e6 if rate > 0 else float('nan')

  def node_rss(self, group: str) -> float:
    """Peak RSS (MB) of the largest node of a group (`actor`, `learner`, ...)."""
    values = [mb for node, mb in self.peak_rss.items() if node.split('/')[0] == group]
    return max(values) if values else float('nan')


def _step_randomly(env: str, env_kwargs: Dict[str, Any], num_envs: int, seconds: float,
                   seed: int, queue) -> None:
  for var in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS'):
    os.environ[var] = '1'
  from seedacme.actor.engines import make_engine  # pylint: disable=g-import-not-at-top
  from seedacme.envs import registry  # pylint: disable=g-import-not-at-top
  engine = make_engine(registry.make_factory(env, **env_kwargs), num_envs, seed=seed)
  rng = np.random.default_rng(seed)
  num_actions = engine.spec.num_actions
  if hasattr(engine, 'recv'):  # a half-batch engine: answer whichever half is ready
    def step() -> int:
      batch = engine.recv()
      engine.send(rng.integers(0, num_actions, len(batch.slots)))
      return len(batch.slots)
  else:
    engine.reset()

    def step() -> int:
      engine.step(rng.integers(0, num_actions, num_envs))
      return num_envs
  for _ in range(20):  # warm-up
    step()
  steps, start = 0, time.monotonic()
  while time.monotonic() - start < seconds:
    steps += step()
  queue.put(steps / (time.monotonic() - start))
  engine.close()


def env_ceiling(env: str, num_procs: int, num_envs: int, seconds: float = 10.0,
                **env_kwargs) -> float:
  """Env steps/s of `num_procs` processes each stepping `num_envs` envs with random
  actions: the same actor engine (`env_kwargs['engine']`) with no inference, no RPC."""
  ctx = multiprocessing.get_context('spawn')
  queue = ctx.Queue()
  procs = [ctx.Process(target=_step_randomly,
                       args=(env, env_kwargs, num_envs, seconds, 1000 * i, queue))
           for i in range(num_procs)]
  for p in procs:
    p.start()
  rates, deadline = [], time.monotonic() + seconds + 120
  while len(rates) < len(procs):
    try:
      rates.append(queue.get(timeout=1.0))
    except Exception:  # pylint: disable=broad-except  (queue.Empty)
      dead = [p for p in procs if p.exitcode not in (None, 0)]
      if dead or time.monotonic() > deadline:
        for p in procs:
          p.kill()
        raise RuntimeError(f'env ceiling workers failed (exit codes '
                           f'{[p.exitcode for p in procs]})') from None
  for p in procs:
    p.join(30)
  return float(sum(rates))


def learner_means(records: List[Dict[str, Any]]) -> Dict[str, float]:
  """Run means of the learner's metrics in progress records (policy lag, clip
  fractions, KL, ...): each learner step a record reported counted once (records
  repeat the latest step's metrics until the next step). The Pong and MuJoCo learning
  benches report it as `learner_means`."""
  per_step = {}
  for r in records:
    if r.get('learner_steps'):
      per_step[r['learner_steps']] = r
  values: Dict[str, List[float]] = {}
  for r in per_step.values():
    for k, v in r.items():
      if (k.startswith('learner_') and k not in ('learner_steps', 'learner_steps_per_s')
          and isinstance(v, (int, float)) and math.isfinite(v)):
        values.setdefault(k[len('learner_'):], []).append(float(v))
  return {k: sum(v) / len(v) for k, v in sorted(values.items())}


def interrupt_on_stop_signals() -> None:
  """Makes SIGTERM, and SIGINT, raise KeyboardInterrupt in this process.

  The long benchmarks stop their program cleanly on KeyboardInterrupt (the launcher
  writes the run's summary). A script started in the background by a non-interactive
  shell inherits SIGINT *ignored*, so Ctrl-C's signal sent by `kill -INT` did nothing
  (seen: a SAC seed ran on after it); and `kill` sends SIGTERM, which killed the script
  and left its program running with no one to read it back.
  """
  def _interrupt(signum, frame):
    del frame
    raise KeyboardInterrupt(signal.Signals(signum).name)
  signal.signal(signal.SIGINT, _interrupt)
  signal.signal(signal.SIGTERM, _interrupt)


def split_passthrough(argv: List[str]) -> 'tuple[List[str], List[str]]':
  """`[own args] -- [run_local args]` -> (own args, args passed through to run_local)."""
  if '--' not in argv:
    return list(argv), []
  i = argv.index('--')
  return argv[:i], argv[i + 1:]


def dumps(value: Any, width: int = 100, level: int = 0, row: bool = False) -> str:
  """JSON as the published results are written: one key a line, but on one line a value
  that fits in `width` columns, a record of scalars (up to 4 x `width`), an item of a
  list (a table's row, up to 10 x `width`), a list of numbers (a curve) or a list of such
  lists: a result with per-seed curves and tables of runs stays a few hundred lines
  (json.dump's indent puts every number of a curve on its own line), and `json.loads`
  reads it as ever."""
  flat = json.dumps(value)
  def scalar(x):
    return not isinstance(x, (dict, list))
  def numbers(x):
    return scalar(x) or isinstance(x, list) and all(map(scalar, x))
  if (scalar(value) or len(flat) + level <= width or row and len(flat) <= 10 * width or
      isinstance(value, list) and all(map(numbers, value)) or
      isinstance(value, dict) and len(flat) <= 4 * width and all(map(numbers, value.values()))):
    return flat
  pad, end = ' ' * (level + 1), ' ' * level
  if isinstance(value, dict):
    items = [f'{pad}{json.dumps(k)}: {dumps(v, width, level + 1)}' for k, v in value.items()]
    return '{\n' + ',\n'.join(items) + '\n' + end + '}'
  return ('[\n' + ',\n'.join(pad + dumps(v, width, level + 1, row=True) for v in value) +
          '\n' + end + ']')


def write_json(name: str, payload: Dict[str, Any]) -> str:
  os.makedirs(RESULTS, exist_ok=True)
  path = os.path.join(RESULTS, name)
  with open(path + '.tmp', 'w') as f:  # a reader never sees half a file
    f.write(dumps(payload) + '\n')
  os.replace(path + '.tmp', path)
  return path


def print_table(rows: List[Dict[str, Any]], columns: List[str]) -> None:
  """A plain fixed-width table of `rows` (numbers formatted compactly)."""
  def fmt(v):
    if isinstance(v, float):
      if v != v:
        return '-'
      return f'{v:,.0f}' if abs(v) >= 100 else f'{v:.2f}'
    return '-' if v is None else str(v)
  cells = [[fmt(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
  print('  '.join(c.rjust(w) for c, w in zip(columns, widths)))
  for row in cells:
    print('  '.join(v.rjust(w) for v, w in zip(row, widths)))


def run_configs(run_local_args: List[str], logdir: str | None = None) -> Dict[str, Any]:
  """`agent_config_full` and `env_config_full` of a run: the agent's config dataclass
  and its training envs' options. From `<logdir>/checkpoints/run_config.json` when the
  run saved one (what its central node ran with), else resolved from its `run_local`
  arguments by the launcher's own code (`program_flags.resolved_run`)."""
  from seedacme.launchers import local, program_flags  # pylint: disable=g-import-not-at-top
  from seedacme.envs.registry import factory_options  # pylint: disable=g-import-not-at-top
  from seedacme.run import identity  # pylint: disable=g-import-not-at-top
  saved = identity.read_saved(os.path.join(logdir, identity.CHECKPOINTS)) if logdir else None
  if saved and saved.get('env') and saved.get('agent_config'):
    env_config = factory_options(saved['env'], **(saved.get('env_args') or {}))
    return json.loads(json.dumps({'agent_config_full': saved['agent_config'],
                                  'env_config_full': env_config}))
  return program_flags.resolved_run(local.parse_args(list(run_local_args)))
