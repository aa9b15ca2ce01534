"""Measures what a `kill -9` of each node type costs a running program (README's fault table).

One `run_local catch vtrace 2 8` run; at a random moment within each window the script
kills the work process (the supervisor's child) of actor/0, evaluator/0, the central
node and the replay node, one after the other. For each it reports the time until the
learner steps again (2 steps beyond where it stood 1 s after the kill), the time until
acting is back to 90 % of its throughput over the 10 s before the kill, and what was
lost (learner steps since the central node's last checkpoint; the unrolls in the
V-trace queue for the replay node), and at the end whether the run still reached its
target. Progress records are stamped with wall-clock time as they are read (the
central node's own clock restarts with it), so times are good to about 0.5 s.

    .venv/bin/python bench/fault_table.py [--window_s 40] [--out bench/results/fault_table.json]
"""

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.integration.launch import Run, supervised_child  # noqa: E402

NODES = ('actor/0', 'evaluator/0', 'learner/0', 'replay/0')


class Stamped:
  """Progress records of a run, each stamped with the wall time it was first seen."""

  def __init__(self, run: Run):
    self._run = run
    self.records = []
    self._seen = set()

  def poll(self):
    # By content, not by count: a restarted central node rewrites progress.jsonl back
    # to its checkpoint, so the file can get shorter.
    now = time.time()
    for r in self._run.progress():
      key = (r.get('elapsed_s'), r.get('env_steps'), r.get('learner_steps'))
      if key not in self._seen:
        self._seen.add(key)
        self.records.append(dict(r, wall=now))

  def learner_back_after(self, killed: float) -> float | None:
    """Seconds from the kill until the learner has made 2 steps beyond where it stood
    1 s after it (a step in flight at the kill does not count as resumed)."""
    after = [r for r in self.records if r['wall'] >= killed + 1.0]
    if not after:
      return None
    base = after[0]['learner_steps']
    back = next((r['wall'] for r in after if r['learner_steps'] >= base + 2), None)
    return None if back is None else round(back - killed, 1)

  def rate_between(self, t0: float, t1: float) -> float | None:
    inside = [r for r in self.records if t0 <= r['wall'] <= t1]
    if len(inside) < 2:
      return None
    steps = sum(max(0, b['env_steps'] - a['env_steps']) for a, b in zip(inside, inside[1:]))
    return steps / max(inside[-1]['wall'] - inside[0]['wall'], 1e-9)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--window_s', type=float, default=40.0)
  parser.add_argument('--warmup_s', type=float, default=30.0)
  parser.add_argument('--seed', type=int, default=None)
  parser.add_argument('--out', default='bench/results/fault_table.json')
  parser.add_argument('--standby_restarts', action='store_true',
                      help='run the program with standby replay and central processes')
  args = parser.parse_args()
  rng = random.Random(args.seed)
  workdir = tempfile.mkdtemp(prefix='fault_table_')
  # The windows start at the first progress record; the budget counts from launch.
  total = args.warmup_s + args.window_s * len(NODES) + 120
  run = Run(['catch', 'vtrace', '2', '8', '--max_seconds', str(total), '--progress_interval_s',
             '0.5', '--checkpoint_interval_s', '10']
            + (['--standby_restarts'] if args.standby_restarts else []), workdir)
  stamped = Stamped(run)
  rows = []
  try:
    def wait_until(t):
      while time.time() < t and run.proc.poll() is None:
        stamped.poll()
        time.sleep(0.25)

    # The windows start with the program's first progress record (startup takes
    # 10-60 s depending on the machine's load).
    deadline = time.time() + 180
    while not stamped.records and time.time() < deadline:
      wait_until(time.time() + 0.5)
    if not stamped.records:
      raise RuntimeError(f'no progress record within 180 s: {run.logdir}')
    start = time.time()

    for i, node in enumerate(NODES):
      window = start + args.warmup_s + i * args.window_s
      kill_at = window + rng.uniform(0, args.window_s / 2)
      wait_until(kill_at)
      before = stamped.rate_between(kill_at - 10, kill_at)
      last = stamped.records[-1]
      victim = supervised_child(run, node)
      os.kill(victim, signal.SIGKILL)
      killed = time.time()
      back = None
      while time.time() < killed + args.window_s / 2 + 5:
        wait_until(time.time() + 0.5)
        now = time.time()
        if now - 2.5 < killed:
          continue  # only windows that start after the kill
        rate = stamped.rate_between(now - 2.5, now)
        if rate is not None and before and rate >= 0.9 * before:
          back = now - 2.5 - killed  # the start of the first 2.5-s window back at 90 %
          break
      # Acting can be back before learning is (the queue takes the unrolls meanwhile).
      while (stamped.learner_back_after(killed) is None
             and time.time() < killed + args.window_s / 2 + 5):
        wait_until(time.time() + 0.5)
      rows.append({'node': node, 'killed_at_s': round(killed - start, 1),
                   'learner_back_after_s': stamped.learner_back_after(killed),
                   'throughput_before': round(before or 0), 'back_after_s':
                   None if back is None else round(max(back, 0.0), 1),
                   'learner_steps_at_kill': last['learner_steps'],
                   'replay_size_at_kill': last.get('replay_size')})
      print(rows[-1], flush=True)
    code = run.wait(total + 120)
  finally:
    left = run.wait_for_no_leftovers()
  summary = run.json('summary.json') or {}
  resumed = run.events()
  result = {'standby_restarts': args.standby_restarts, 'rows': rows, 'exit_code': code, 'leftovers': left,
            'final_average_return': summary.get('average_return'),
            'stopped_because': summary.get('stopped_because'),
            'trajectory_writer_reconnects': summary.get('trajectory_writer_reconnects'),
            'actor_restarts': summary.get('actor_restarts'), 'events': resumed,
            'records': [{k: r.get(k) for k in ('wall', 'env_steps', 'learner_steps',
                                               'replay_size', 'average_return')}
                        for r in stamped.records]}
  print(json.dumps({k: v for k, v in result.items() if k != 'records'}, indent=1))
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  shutil.rmtree(workdir, ignore_errors=True)
  return 0 if code == 0 and not left else 1


if __name__ == '__main__':
  sys.exit(main())
