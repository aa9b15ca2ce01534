"""Crashes mid-run: a killed actor or central node comes back and training goes on."""

import os
import signal
import time

import pytest

from tests.integration.launch import Run, leftover_processes

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
  assert float(summary['stopped_because'].split()[2]) >= 0.9


@pytest.mark.timeout(420)
def test_killed_central_node_restarts_from_checkpoint_and_actors_reconnect(tmp_path):
  import tensorflow as tf
  logdir = os.path.join(str(tmp_path), 'logdir')
  run = Run(['catch', 'vtrace', '2', '8', '--max_seconds', '240', '--target_return', '0.9',
             '--checkpoint_interval_s', '2', '--progress_interval_s', '1'], str(tmp_path),
            logdir=logdir)

  def checkpointed_step():
    path = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
    return path and tf.train.load_variable(path, 'learner_steps/.ATTRIBUTES/VARIABLE_VALUE')

  try:
    assert _wait_for(lambda: (checkpointed_step() or 0) > 0, 150, run), run.output[-3000:]
    victim = _supervised_child(run, 'learner/0')
    os.kill(victim, signal.SIGKILL)
    saved = checkpointed_step()
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
