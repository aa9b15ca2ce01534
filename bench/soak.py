"""Soak test: a real program runs for a long time; memory must stay flat, nothing may fail,
nothing may be left behind (its own logs, under /tmp, are removed when it passes).

    .venv/bin/python bench/soak.py                # 4 actors, 30 minutes
    .venv/bin/python bench/soak.py --quick        # 2 minutes (CI)

Prints a table (RSS per node after warm-up and at the end, growth) and writes
bench/results/soak[_quick].json. Exits non-zero if any node grew by 5 % or more after the
warm-up, if node logs show errors while running, or if a process outlives the run.
"""

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid

import harness

from seedacme.launchers import process
from seedacme.run import logdir as logdir_lib

REPO = harness.REPO
TAG_VAR = 'SEEDACME_SOAK_TAG'
ERROR_PATTERNS = (re.compile(r'^Traceback'), re.compile(r'^E\d{4} '), re.compile(r'^F\d{4} '))
# Errors that belong to an orderly shutdown, not to the run.
SHUTDOWN_NOISE = ('BatcherClosedError', 'shutting down', 'WriterClosedError')


def count_errors(nodes_dir):
  errors = {}
  for root, _, files in os.walk(nodes_dir):
    for name in files:
      path = os.path.join(root, name)
      node = os.path.relpath(path, nodes_dir)
      with open(path, errors='replace') as f:
        lines = f.read().splitlines()
      # Ignore what follows the stop signal: in-flight calls failing at shutdown.
      stop = next((i for i, line in enumerate(lines)
                   if 'Waiting for workers to stop' in line or 'stopping' in line.lower()),
                  len(lines))
      bad = [line for line in lines[:stop] if any(p.match(line) for p in ERROR_PATTERNS)
             and not any(n in line for n in SHUTDOWN_NOISE)]
      errors[node] = len(bad)
  return errors


def _learning(logdir: str) -> bool:
  """Whether the run's progress shows a learner step (its nodes are all up)."""
  try:
    return any((r.get('learner_steps') or 0) > 0 for r in logdir_lib.read_progress(logdir))
  except (OSError, ValueError):
    return False


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true', help='2 minutes instead of 30')
  parser.add_argument('--minutes', type=float, default=None)
  parser.add_argument('--actors', type=int, default=4)
  parser.add_argument('--envs_per_actor', type=int, default=16)
  parser.add_argument('--env', default='catch')
  parser.add_argument('--agent', default='vtrace')
  parser.add_argument('--max_growth', type=float, default=0.05)
  args = parser.parse_args()
  harness.interrupt_on_stop_signals()
  minutes = args.minutes or (2.0 if args.quick else 30.0)
  # Warm-up counts from the first learner step, not from the launch: under load (11-16,
  # two cores) a start-up took longer than a launch-based warm-up of 27 s, and the
  # baseline caught the learner before its TensorFlow import (309 -> 596 MB: "growth").
  warmup_s = min(60.0, 0.2 * minutes * 60)
  tag = uuid.uuid4().hex
  work = tempfile.mkdtemp(prefix='seedacme_soak_')
  logdir = os.path.join(work, 'logdir')
  nodes_dir = os.path.join(logdir, 'nodes') + os.sep
  run_args = [args.env, args.agent, str(args.actors), str(args.envs_per_actor),
              '--max_seconds', str(minutes * 60), '--progress_interval_s', '10']
  print(f'soak: run_local {" ".join(run_args)} (warm-up {warmup_s:.0f}s)', flush=True)
  with open(os.path.join(work, 'stdout.txt'), 'w') as out:
    proc = process.start(run_args, logdir, out, env={TAG_VAR: tag}, cwd=REPO)
    start = time.monotonic()
    baseline, last, samples, learning_since = None, None, 0, None
    try:
      while proc.poll() is None:
        time.sleep(10)
        rss = harness.rss_by_node(tag, nodes_dir, TAG_VAR)
        if not rss:
          continue
        elapsed = time.monotonic() - start
        if learning_since is None and _learning(logdir):
          learning_since = elapsed
        if (baseline is None and learning_since is not None
            and elapsed - learning_since >= warmup_s):
          baseline = rss
        # Until the run writes its summary (it is stopping): samples while it runs.
        if (baseline is not None and rss is not baseline and proc.poll() is None
            and logdir_lib.read_summary(logdir) is None):
          last, samples = rss, samples + 1
        print(f'soak: {elapsed:5.0f}s total RSS {sum(rss.values()):7.0f} MB', flush=True)
      code = proc.wait()
    except KeyboardInterrupt:
      os.killpg(proc.pid, signal.SIGINT)
      code = proc.wait(60)
  time.sleep(3)
  leftovers = [p.pid for p in harness.tagged_processes(tag, TAG_VAR)]
  for p in leftovers:
    os.kill(p, signal.SIGKILL)
  errors = count_errors(nodes_dir)
  summary = logdir_lib.read_summary(logdir) or {}

  # No baseline (learning never started, or started too late to warm up): nothing was
  # measured, which is a failure, not a pass.
  rows, ok = [], (code == 0 and not leftovers and not any(errors.values())
                  and baseline is not None and samples >= 2)
  print(f'\n{"node":<14} {"RSS after warm-up":>18} {"RSS at end":>11} {"growth":>8} {"errors":>7}')
  for node in sorted(baseline or {}):
    first, end = baseline[node], (last or {}).get(node, baseline[node])
    growth = end / first - 1.0
    ok = ok and growth < args.max_growth
    rows.append(dict(node=node, rss_warm_mb=round(first, 1), rss_end_mb=round(end, 1),
                     growth=round(growth, 4), errors=errors.get(node, 0)))
    print(f'{node:<14} {first:15.0f} MB {end:8.0f} MB {100 * growth:7.2f}% {errors.get(node, 0):7d}')
  print(f'\nexit code {code}; processes left after stop: {len(leftovers)}; '
        f'env steps {summary.get("env_steps")}; learner steps {summary.get("learner_steps")}; '
        f'samples {samples}; {"PASS" if ok else "FAIL"}')
  os.makedirs(os.path.join(REPO, 'bench', 'results'), exist_ok=True)
  result_path = os.path.join(REPO, 'bench', 'results', 'soak_quick.json' if args.quick
                             else 'soak.json')
  with open(result_path, 'w') as f:
    json.dump(dict(minutes=minutes, actors=args.actors, envs_per_actor=args.envs_per_actor,
                   env=args.env, agent=args.agent, exit_code=code, leftovers=leftovers,
                   nodes=rows, env_steps=summary.get('env_steps'),
                   learner_steps=summary.get('learner_steps'), passed=ok,
                   logdir=logdir, logdir_kept=not ok), f, indent=1)
  print(f'soak: wrote {result_path}')
  # A passing run's logs are not needed (CI ran one per stop and left them in /tmp);
  # a failing run's are the evidence.
  if ok:
    shutil.rmtree(work, ignore_errors=True)
  else:
    print(f'soak: logs kept in {work}')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
