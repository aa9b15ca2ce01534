"""Start-up by phase: where the seconds from the launch command to the first env step go.

    .venv/bin/python bench/startup.py            # Catch V-trace, then MuJoCo PPO (~3 minutes)
    .venv/bin/python bench/startup.py --quick    # Catch V-trace only (~1 minute)
    .venv/bin/python bench/startup.py --before /tmp/old --rounds 2   # before/after

`--before CHECKOUT`: the same jobs from another checkout of the repository (e.g. `git
worktree add /tmp/old <commit>`), alternating before, after, before, ... so both see the
same load drift; prints per job the median of each side's launch to first env step and
the ratio, and writes every round. The other checkout runs with this venv and its own
code (`python -m seedacme.launchers.local` from its root).

Issue 48 ("measure first"). Each job is the command a user types
(`scripts/run_local catch vtrace 2 --max_seconds 30`; `scripts/run_local mujoco ppo 2 8
--level HalfCheetah-v5 --max_seconds 40`), run one after the other, each with a logdir
of its own; the wall time the command was started is the zero of its timeline. After
the run the script reads the start-up marks (`seedacme.runtime.startup`: `startup: <node>
<phase> +<process age>s (at <unix time>, pid N)`) from every node log under
`<logdir>/nodes/` and the launcher's stdout, and the absl lines the marks cannot stand
in for (a supervisor naming the child it started; on a checkout without marks, the
log lines of the same phases). Every process -- the launcher, each node's supervisor
(`parent`, the Launchpad node process) and its child -- gets a row per phase: the time
since the launch command (`t_s`), the process's age then (`age_s`: its interpreter
start and imports included) and the time since its previous phase (`step_s`; the
first phase's is since the process started). `start` is the process's creation, from
the kernel. Then: launch to the first env step (the first actor's `first_answer`) and
the largest steps.

Timings on a loaded 2-core machine are noisy: the load average before and after each
job is printed and written with it. Prints the tables and writes
bench/results/startup[_quick].json (`--out` names another). Asserts nothing: it reports.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List

from harness import (REPO, TAG_VAR, commit, machine, print_table, tagged_processes,
                     write_json)

from seedacme.runtime.startup import LINE_RE

JOBS = (('catch_vtrace', ['catch', 'vtrace', '2', '--max_seconds', '30']),
        ('mujoco_ppo', ['mujoco', 'ppo', '2', '8', '--level', 'HalfCheetah-v5',
                        '--max_seconds', '40']))
COLUMNS = ['process', 'pid', 'phase', 't_s', 'age_s', 'step_s']

# `I1128 11:12:36.899388 140332286917504 startup.py:86] message` (local time, no year).
ABSL_RE = re.compile(r'^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) +\d+ [^\]]*\] (.*)$')
SPAWNED_RE = re.compile(r': started (child|standby) process (\d+)')
# Log lines of phases that have a mark: read when a process left no mark of that
# phase (a checkout before the marks), and given to the node's first child.
ABSL_PHASES = (('inference_compiled', re.compile(r'Inference batch step compiled in')),
               ('serving', re.compile(r'Central node ready')),
               ('learner_traced', re.compile(r'Learner step traced in')),
               ('first_answer', re.compile(r'first answer from the inference server')))


def absl_time(line: str, year: int) -> float | None:
  """The unix time of an absl log line (its local time, in `year`), else None."""
  m = ABSL_RE.match(line)
  if not m:
    return None
  month, day, hour, minute, sec = m.groups()[:5]
  whole = time.mktime((year, int(month), int(day), int(hour), int(minute), 0, 0, 0, -1))
  return whole + float(sec)


def _read_lines(path: str) -> List[str]:
  try:
    with open(path, errors='replace') as f:
      # Launchpad's countdown ends without a newline: a log line may follow on it.
      return [part for row in f for part in re.split(r'(?<=\.)(?=[IWEF]\d{4} )', row)]
  except OSError:
    return []


def read_processes(logdir: str, launcher_stdout: str | None = None,
                   year: int | None = None) -> List[Dict[str, Any]]:
  """Every process of a run that left a start-up mark, from `<logdir>/nodes/` (one log
  per node: its supervisor's lines and its children's) and the launcher's stdout.

  Each: `process` ('launcher', 'replay/0 parent', 'actor/1 child', ...), `node`, `role`,
  `pid`, `started_at` (unix time the process was created, when a mark says its age)
  and `phases`: [{'phase', 'at', 'age'}] in time order.
  """
  year = year or time.localtime().tm_year
  sources = []
  nodes_dir = os.path.join(logdir, 'nodes')
  for root, _, files in os.walk(nodes_dir):
    for name in files:
      path = os.path.join(root, name)
      sources.append((os.path.relpath(path, nodes_dir), path))
  if launcher_stdout:
    sources.append(('launcher', launcher_stdout))
  processes: List[Dict[str, Any]] = []
  for node, path in sorted(sources):
    children: Dict[int, str] = {}  # pid -> role, in the order the supervisor started them
    by_pid: Dict[int, Dict[str, Any]] = {}
    logged: List[tuple] = []  # (phase, time) from absl lines, for phases not marked
    for row in _read_lines(path):
      spawned = SPAWNED_RE.search(row)
      if spawned:
        kind, pid = spawned.group(1), int(spawned.group(2))
        count = sum(1 for r in children.values() if r.startswith(kind))
        children[pid] = kind if count == 0 else f'{kind} {count + 1}'
        continue
      m = LINE_RE.search(row)
      if m:
        pid = int(m['pid']) if m['pid'] else 0
        proc = by_pid.setdefault(pid, {'node': node, 'pid': pid, 'started_at': None,
                                       'phases': []})
        at = float(m['at'])
        age = float(m['since']) if m['since'] else None
        if age is not None and proc['started_at'] is None:
          proc['started_at'] = at - age
        proc['phases'].append({'phase': m['phase'], 'at': at, 'age': age})
        continue
      for phase, pattern in ABSL_PHASES:
        if pattern.search(row):
          t = absl_time(row, year)
          if t is not None:
            logged.append((phase, t))
    if not by_pid and not logged:
      continue
    first_child = next(iter(children), None)
    for phase, t in logged:
      proc = by_pid.get(first_child) if first_child is not None else None
      if proc is None:  # no marks at all: the child, or the node's only process
        pid = first_child or 0
        proc = by_pid.setdefault(pid, {'node': node, 'pid': pid, 'started_at': None,
                                       'phases': []})
      if all(p['phase'] != phase for p in proc['phases']):
        proc['phases'].append({'phase': phase, 'at': t, 'age': None})
    for pid, proc in by_pid.items():
      if node == 'launcher':
        proc['role'] = ''
      else:
        proc['role'] = children.get(pid, 'parent' if children or len(by_pid) > 1 else '')
      proc['process'] = f"{node} {proc['role']}".strip()
      proc['phases'].sort(key=lambda p: p['at'])
      processes.append(proc)
  processes.sort(key=lambda p: (p['started_at'] if p['started_at'] is not None
                                else p['phases'][0]['at']))
  return processes


def phase_rows(processes: List[Dict[str, Any]], t0: float) -> List[Dict[str, Any]]:
  """Table rows: per process its `start` (when known) and each phase, `t_s` since the
  launch command (`t0`, unix time)."""
  rows = []
  for proc in processes:
    last = proc['started_at']
    if last is not None:
      rows.append({'process': proc['process'], 'pid': proc['pid'], 'phase': 'start',
                   't_s': last - t0, 'age_s': 0.0, 'step_s': None})
    for p in proc['phases']:
      rows.append({'process': proc['process'], 'pid': proc['pid'], 'phase': p['phase'],
                   't_s': p['at'] - t0, 'age_s': p['age'],
                   'step_s': None if last is None else p['at'] - last})
      last = p['at']
  return rows


def summarize(processes: List[Dict[str, Any]], t0: float, top: int = 6) -> Dict[str, Any]:
  """Launch (`t0`) to the first env step (the first actor's `first_answer`) and to the
  other milestones, in seconds; the `top` largest steps of any process."""
  def first(node_prefix: str, phase: str):
    times = [(p['at'], proc['process']) for proc in processes
             if proc['node'].startswith(node_prefix) for p in proc['phases']
             if p['phase'] == phase]
    return (min(times)[0] - t0, min(times)[1]) if times else (None, None)
  out: Dict[str, Any] = {}
  out['launch_to_first_env_step_s'], out['first_env_step_by'] = first('actor/', 'first_answer')
  for key, (prefix, phase) in {'launcher_launching_s': ('launcher', 'launching'),
                               'replay_serving_s': ('replay/', 'serving'),
                               'central_serving_s': ('learner/', 'serving'),
                               'learner_traced_s': ('learner/', 'learner_traced'),
                               'evaluator_first_answer_s': ('evaluator/', 'first_answer')
                               }.items():
    out[key] = first(prefix, phase)[0]
  steps = [r for r in phase_rows(processes, t0) if r['step_s'] is not None]
  steps.sort(key=lambda r: -r['step_s'])
  out['largest_steps'] = [{'process': r['process'], 'to_phase': r['phase'],
                           'step_s': r['step_s']} for r in steps[:top]]
  return out


def _stop(proc: subprocess.Popen, tag: str) -> None:
  """Ends the launcher's process group (SIGINT: a clean stop, then SIGKILL) and any
  process of the run left anywhere else (found by its tag)."""
  if proc.poll() is None:
    try:
      os.killpg(proc.pid, signal.SIGINT)
      proc.wait(30)
    except (OSError, subprocess.TimeoutExpired):
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except OSError:
        pass
      proc.wait()
  for p in tagged_processes(tag):
    try:
      p.kill()
    except Exception:  # pylint: disable=broad-except  (gone meanwhile)
      pass


def run_job(name: str, args: List[str], timeout_s: float,
            checkout: str | None = None) -> Dict[str, Any]:
  """Runs `scripts/run_local <args> --logdir <own temp dir>` (of `checkout`: its own
  code, this venv's Python); its phases as read back."""
  workdir = tempfile.mkdtemp(prefix=f'seedacme_bench_startup_{name}_')
  logdir = os.path.join(workdir, 'logdir')
  stdout_path = os.path.join(workdir, 'stdout.txt')
  if checkout is None:
    command = [os.path.join('scripts', 'run_local'), *args, '--logdir', logdir]
  else:
    command = [sys.executable, '-m', 'seedacme.launchers.local', *args, '--logdir', logdir]
  tag = uuid.uuid4().hex
  load_before = list(os.getloadavg())
  print(f'startup: {name}: {" ".join(command)} (load {load_before[0]:.2f} '
        f'{load_before[1]:.2f} {load_before[2]:.2f})', flush=True)
  with open(stdout_path, 'w') as out:
    t0 = time.time()
    env = dict(os.environ, **{TAG_VAR: tag})
    if checkout is not None:
      env['PYTHONPATH'] = checkout
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                            cwd=checkout or REPO, env=env, start_new_session=True)
    timed_out = False
    try:
      proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      _stop(proc, tag)
    except BaseException:  # Ctrl-C or any error: nothing of the run is left behind
      _stop(proc, tag)
      raise
  code = proc.returncode
  wall_s = time.time() - t0
  time.sleep(2)
  leftovers = [p.pid for p in tagged_processes(tag)]
  _stop(proc, tag)
  load_after = list(os.getloadavg())
  processes = read_processes(logdir, stdout_path, time.localtime(t0).tm_year)
  result = {'name': name, 'checkout': checkout or REPO, 'command': command,
            'started_at': t0, 'exit_code': code,
            'timed_out': timed_out, 'leftovers': leftovers, 'wall_s': wall_s,
            'load_before': load_before, 'load_after': load_after,
            'processes': processes, 'rows': phase_rows(processes, t0),
            'summary': summarize(processes, t0)}
  if code == 0 and not timed_out and not leftovers:
    shutil.rmtree(workdir, ignore_errors=True)
  else:
    print(f'startup: {name}: exit {code}{" (timed out)" if timed_out else ""}, '
          f'leftovers {leftovers}; logs kept in {workdir}', flush=True)
  return result


def print_job(job: Dict[str, Any]) -> None:
  s = job['summary']
  lb, la = job['load_before'], job['load_after']
  print(f"\n{job['name']}: {' '.join(job['command'][:-2])} (exit {job['exit_code']}; "
        f"load before {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}, after {la[0]:.2f} {la[1]:.2f} "
        f"{la[2]:.2f})")
  print('t_s: since the launch command; age_s: the process\'s age at the mark; step_s: '
        'since its previous row')
  print_table(job['rows'], COLUMNS)
  def fmt(v):
    return '-' if v is None else f'{v:.2f}s'
  print(f"launch to first env step: {fmt(s['launch_to_first_env_step_s'])} "
        f"({s['first_env_step_by']}); launcher launching {fmt(s['launcher_launching_s'])}, "
        f"replay serving {fmt(s['replay_serving_s'])}, central serving "
        f"{fmt(s['central_serving_s'])}, learner traced {fmt(s['learner_traced_s'])}, "
        f"evaluator first answer {fmt(s['evaluator_first_answer_s'])}")
  print('largest steps: ' + '; '.join(f"{r['process']} ->{r['to_phase']} {r['step_s']:.2f}s"
                                      for r in s['largest_steps']))


def compare(results: List[Dict[str, Any]], before: str) -> List[Dict[str, Any]]:
  """Per job: each side's median launch to first env step (and central serving), the
  ratio after/before, and the loads the runs saw."""
  rows = []
  for name in dict.fromkeys(r['name'] for r in results):
    side = {}
    for label, path in (('before', before), ('after', REPO)):
      runs = [r for r in results if r['name'] == name and r['checkout'] == path]
      def med(key, runs=runs):
        values = [r['summary'][key] for r in runs if r['summary'][key] is not None]
        return statistics.median(values) if values else None
      side[label] = {'first_step_s': med('launch_to_first_env_step_s'),
                     'serving_s': med('central_serving_s'),
                     'launching_s': med('launcher_launching_s'),
                     'loads': [round(r['load_before'][0], 2) for r in runs]}
    b, a = side['before']['first_step_s'], side['after']['first_step_s']
    rows.append({'job': name, **{f'{k}_{label}': v for label in ('before', 'after')
                                 for k, v in side[label].items()},
                 'ratio_after_before': round(a / b, 3) if a and b else None})
  return rows


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='the Catch job only')
  parser.add_argument('--before', default=None,
                      help='another checkout: run its jobs alternately with this one\'s')
  parser.add_argument('--rounds', type=int, default=1,
                      help='with --before: before/after pairs per job')
  parser.add_argument('--out', default=None,
                      help='name of the JSON in bench/results/ (default startup[_quick].json)')
  args = parser.parse_args()
  jobs = JOBS[:1] if args.quick else JOBS
  before = os.path.abspath(args.before) if args.before else None
  sides = [before, None] if before else [None]
  results = []
  for _ in range(args.rounds if before else 1):
    for name, job_args in jobs:
      seconds = float(job_args[job_args.index('--max_seconds') + 1])
      for checkout in sides:
        results.append(run_job(name, job_args, timeout_s=seconds + 240, checkout=checkout))
        print_job(results[-1])
  extra = {}
  if before:
    extra = {'before': {'checkout': before, **commit(before)},
             'comparison': compare(results, before)}
    print('\nbefore/after (median over rounds; loads: 1-minute average at each start)')
    print_table(extra['comparison'], list(extra['comparison'][0]))
  path = write_json(args.out or ('startup_quick.json' if args.quick else 'startup.json'),
                    {'machine': machine(), **commit(), **extra, 'jobs': results})
  print(f'\nstartup: wrote {path}')
  return 1 if any(r['exit_code'] != 0 or r['leftovers'] for r in results) else 0


if __name__ == '__main__':
  sys.exit(main())
