"""Crashes mid-run: a killed actor or central node comes back and training goes on."""

import os
import signal
import time

import pytest

from tests.integration.launch import (Run, checkpointed_learner_step, leftover_processes,
                                      target_value)

pytestmark = pytest.mark.integration


def _supervised_child(run: Run, node: str) -> int:
  """Pid of the process doing `node`'s work (the supervisor's child)."""
  log = os.path.join(run.logdir, 'nodes', node)
  for pid in leftover_processes(run.tag):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmdline = f.read().split(b'\0')
      if b'seedacme.supervisor' in cmdline and os.readlink(f'/proc/{pid}/fd/1') == log:
        return pid
    except OSError:
      continue
  raise AssertionError(f'no supervised child for {node}')


def _wait_for(predicate, timeout, run):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and run.proc.poll() is None:
    if predicate():
      return True
    time.sleep(0.5)
  return predicate()


@pytest.mark.timeout(360)
def test_killed_actor_is_restarted_and_learning_continues(tmp_path):
  run = Run(['catch', 'vtrace', '2', '8', '--max_seconds', '240', '--target_return', '0.9',
             '--progress_interval_s', '2'], str(tmp_path))
  try:
    assert _wait_for(lambda: any(r['learner_steps'] > 0 for r in run.progress()), 150, run), \
        run.output[-3000:]
    # The server must know this actor's run id before the kill, or the new one is not
    # a change (a slow start can keep one actor waiting while the others are served).
    assert _wait_for(lambda: 'first answer from the inference server' in
                     run.node_log('actor/0'), 60, run), run.output[-3000:]
    victim = _supervised_child(run, 'actor/0')
    os.kill(victim, signal.SIGKILL)
    code = run.wait(300)
  finally:
    leftovers = run.wait_for_no_leftovers()
  assert code == 0, run.output[-3000:]
  assert not leftovers
  assert f'child {victim} died (exit code -9); restart #1' in run.node_log('actor/0')
  # The server saw new run ids for that actor's envs and reset them.
  assert 'Run id changed for 8 envs (actor restart)' in run.node_log('learner/0')
  summary = run.json('summary.json')
  assert summary['actor_restarts'] >= 1
  assert 'target' in summary['stopped_because']
  assert target_value(summary) >= 0.9


@pytest.mark.timeout(420)
def test_killed_central_node_restarts_from_checkpoint_and_actors_reconnect(tmp_path):
  logdir = os.path.join(str(tmp_path), 'logdir')
  run = Run(['catch', 'vtrace', '2', '8', '--max_seconds', '240', '--target_return', '0.9',
             '--checkpoint_interval_s', '2', '--progress_interval_s', '1'], str(tmp_path),
            logdir=logdir)
  try:
    saved_any = lambda: (checkpointed_learner_step(logdir) or 0) > 0  # noqa: E731
    assert _wait_for(saved_any, 150, run), run.output[-3000:]
    victim = _supervised_child(run, 'learner/0')
    os.kill(victim, signal.SIGKILL)
    saved = checkpointed_learner_step(logdir)
    code = run.wait(360)
  finally:
    leftovers = run.wait_for_no_leftovers()
  assert code == 0, run.output[-3000:]
  assert not leftovers
  learner_log = run.node_log('learner/0')
  assert f'child {victim} died (exit code -9); restart #1' in learner_log
  assert 'Restored checkpoint' in learner_log
  resumed = [int(line.rsplit('learner step ', 1)[1].split(',')[0])
             for line in run.output.splitlines() if 'resumed from checkpoint' in line]
  assert resumed and resumed[-1] >= saved  # continued from the checkpoint, not from 0
  # Actors noticed (a failed call retried with backoff, or a call waiting on the restart)
  # and carried on with the new central node.
  actor_log = run.node_log('actor/0')
  assert 'retrying' in actor_log or 'no answer from the inference server' in actor_log
  summary = run.json('summary.json')
  assert summary['resumed_from_learner_step'] == resumed[-1]
  assert summary['learner_steps'] > resumed[-1]


def _rss_mb(pids):
  import psutil
  total = 0.0
  for pid in pids:
    try:
      total += psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
      pass
  return total


@pytest.mark.timeout(300)
def test_slow_learner_blocks_actors_and_memory_stays_flat(tmp_path):
  # The learner takes a step every 0.5 s: actors produce far more than it can consume.
  run = Run(['catch', 'vtrace', '2', '16', '--max_seconds', '75', '--learner_step_delay_s',
             '0.5', '--num_eval_envs', '0', '--progress_interval_s', '2'], str(tmp_path))
  try:
    full = lambda: any((r.get('replay_size') or 0) >= 256 for r in run.progress())  # noqa: E731
    assert _wait_for(full, 150, run), run.output[-3000:]  # the queue filled up ...
    time.sleep(5)
    first = _rss_mb(leftover_processes(run.tag))
    records_then = run.progress()
    time.sleep(30)
    second = _rss_mb(leftover_processes(run.tag))
    records_now = run.progress()
    code = run.wait(120)
  finally:
    leftovers = run.wait_for_no_leftovers()
  assert code == 0, run.output[-3000:]
  assert not leftovers
  # ... and stayed bounded: the rate limiter holds the queue at its size,
  assert all(r['replay_size'] <= 256 for r in records_now if r.get('replay_size') is not None)
  # inference waited on it (the writer blocked) and acting slowed to the learner's pace:
  # 32 unrolls x 20 steps per learner step, about 2 steps/s -> ~1,300 env steps/s.
  assert records_now[-1]['trajectory_writer_blocked_s'] > records_then[-1]['trajectory_writer_blocked_s']
  rate = ((records_now[-1]['env_steps'] - records_then[-1]['env_steps'])
          / (records_now[-1]['elapsed_s'] - records_then[-1]['elapsed_s']))
  assert rate < 2500, rate
  # Memory of the whole program stays flat while it is throttled.
  assert second < first * 1.05 + 20, (first, second)
