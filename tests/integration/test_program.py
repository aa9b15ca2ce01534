"""The real program: Launchpad local_mp, Reverb, Courier, env-only actors, learning.

One launch per test, several assertions per launch (a program takes 11-25 s to start).
R2D2's Catch solve is in test_reliability.py, where its program also carries the replay
restore (`test_r2d2_restores_a_killed_replay_node_and_solves_catch_with_priority_updates`).
"""

import glob
import os
import re
import time

import pytest

from tests.integration.launch import (Run, check_servers_isolated, checkpointed_learner_step,
                                      leftover_processes, target_value, wait_for)

pytestmark = pytest.mark.integration


@pytest.mark.long('learns Catch to 0.9: ~80 s, up to 6 min under load')
@pytest.mark.timeout(360)
def test_vtrace_solves_catch_and_shuts_down_cleanly(tmp_path):
  # Inference on one logical CPU and the learner data-parallel over two others (was a
  # program of its own, test_catch_learns_with_the_learner_on_two_devices).
  run = Run(['catch', 'vtrace', '2', '16', '--max_seconds', '240', '--target_return', '0.9',
             '--progress_interval_s', '3', '--logical_cpus', '3', '--inference_devices', '1',
             '--learner_devices', '2'], str(tmp_path))
  run.complete(330)
  out = run.output
  assert ('inference on /device:CPU:0; learner on /device:CPU:1, /device:CPU:2'
          in run.node_log('learner/0'))

  # It learned: the budget that stopped it is the target return, not the time limit.
  summary = run.json('summary.json')
  # (The summary's own average is taken a moment later and may dip below the target.)
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary
  assert target_value(summary) >= 0.9
  assert summary['average_return'] > 0.5
  assert re.search(r'final average return \d', out), out[-2000:]

  # Progress: env steps and learner steps grow; returns rise from random (about -0.6).
  records = run.progress()
  assert len(records) >= 3
  steps = [r['env_steps'] for r in records]
  assert steps == sorted(steps) and steps[-1] > max(steps[0], 0)
  assert records[-1]['learner_steps'] > 0
  assert records[0]['average_return'] is None or records[0]['average_return'] < 0.5
  assert max(r['average_return'] or -1 for r in records) >= 0.9
  assert glob.glob(os.path.join(run.logdir, 'tensorboard', 'events.out.tfevents.*'))

  # Env-only actors: no TensorFlow, a fraction of the central node's memory.
  for node in ('actor/0', 'actor/1', 'evaluator/0'):
    assert 'tensorflow imported: False' in run.node_log(node), node
  memory = run.json('memory.json')['peak_rss_mb']
  assert memory['actor/0'] < 200 and memory['actor/1'] < 200, memory
  assert memory['learner/0'] > 2 * memory['actor/0'], memory
  assert 'Traceback' not in run.node_log('learner/0')


@pytest.mark.long('learns Catch to 0.9 (actor-side inference): ~50 s, up to 5 min under load')
@pytest.mark.timeout(300)
def test_actor_side_inference_program_learns_catch(tmp_path):
  """inference='actor': each actor runs its own policy copy, pulls parameters from the
  learner, writes its own unrolls; the central node learns and reports progress."""
  run = Run(['catch', 'vtrace', '2', '16', '--inference', 'actor', '--max_seconds', '150',
             '--target_return', '0.9', '--target_on', 'eval', '--variable_update_period',
             '20', '--progress_interval_s', '3'], str(tmp_path))
  run.complete(270)
  summary = run.json('summary.json')
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary
  assert target_value(summary) >= 0.9
  # Progress came from the actors' reports: steps, episodes and learner steps all moved.
  assert summary['env_steps'] > 10_000 and summary['episodes'] > 1_000
  assert summary['learner_steps'] > 0 and summary['trajectory_items_written'] > 0
  for node in ('actor/0', 'actor/1', 'evaluator/0'):
    log = run.node_log(node)
    assert 'tensorflow imported: True' in log, node  # the network lives in the actor
    assert 'got' in log and 'variables from the learner' in log, node
  memory = run.json('memory.json')['peak_rss_mb']
  assert memory['actor/0'] > 300, memory  # a TF process, unlike an env-only actor
  assert 'Traceback' not in run.node_log('learner/0')


def _check_servers_unreachable_from_host(run):
  """Local launches keep Courier and Reverb (which bind all interfaces) off the network:
  in a namespace of their own, or on loopback where the host has none."""
  check_servers_isolated(run.output, leftover_processes(run.tag))


@pytest.mark.long('learns CartPole to 475: ~2.5 min, up to 7 under load')
@pytest.mark.timeout(420)
def test_vtrace_solves_cartpole(tmp_path):
  run = Run(['cartpole', 'vtrace', '2', '16', '--max_seconds', '300', '--target_return', '475'],
            str(tmp_path))
  run.complete(400)
  summary = run.json('summary.json')
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary
  assert target_value(summary) >= 475


@pytest.mark.skipif(not os.environ.get('SEEDACME_SLOW_TESTS'),
                    reason='before a release: 3-5 minutes more; set SEEDACME_SLOW_TESTS=1')
@pytest.mark.long('learns CartPole to 475 greedy (R2D2): 3-5 min')
@pytest.mark.timeout(600)
def test_r2d2_solves_cartpole_greedy(tmp_path):
  run = Run(['cartpole', 'r2d2', '2', '16', '--max_seconds', '480', '--target_return', '475',
             '--target_on', 'eval'], str(tmp_path))
  run.complete(560)
  assert target_value(run.json('summary.json')) >= 475



@pytest.mark.timeout(480)
def test_killed_run_resumes_from_its_checkpoint_and_ctrl_c_stops_every_node(tmp_path):
  """A run SIGKILLed whole (a lost machine: no handler runs) resumes from its last
  checkpoint with the same command; Ctrl-C mid-training then stops the resumed run: every
  node within 15 s, nothing left, the servers unreachable from the host meanwhile. (Two
  programs; the Ctrl-C check was a third of its own.)"""
  logdir = str(tmp_path / 'logdir')
  first = Run(['catch', 'vtrace', '2', '8', '--max_seconds', '600', '--checkpoint_interval_s',
               '2', '--progress_interval_s', '1'], str(tmp_path / 'first'), logdir=logdir)
  try:
    deadline = time.monotonic() + 180
    saved = None
    while time.monotonic() < deadline and first.proc.poll() is None:
      saved = checkpointed_learner_step(logdir)
      if saved:
        break
      time.sleep(1)
    assert saved, 'no checkpoint was written\n' + first.output[-3000:]
  finally:
    first.kill()  # SIGKILL every process: a lost machine, no shutdown handlers run
  assert not first.wait_for_no_leftovers()
  saved = checkpointed_learner_step(logdir)  # the last one written before the kill
  written = len(first.progress())  # the first run's records (progress.jsonl spans both)

  with Run(['catch', 'vtrace', '2', '8', '--max_seconds', '600', '--progress_interval_s',
            '1'], str(tmp_path / 'second'), logdir=logdir) as second:
    # Interrupt mid-training, 20 learner steps past the resume: actors stepping, the
    # learner inside Reverb sampling.
    past = lambda: any(r['learner_steps'] >= saved + 20  # noqa: E731
                       for r in second.progress()[written:])
    assert wait_for(past, 180, second), second.output[-3000:]
    _check_servers_unreachable_from_host(second)
    second.interrupt()
    start = time.monotonic()
    second.wait(60)
    stop_seconds = time.monotonic() - start
  leftovers = second.wait_for_no_leftovers()
  assert not leftovers, f'processes left behind: {leftovers}'
  assert 'Killing entire runtime' not in second.output  # nobody needed SIGKILL
  assert stop_seconds < 15, stop_seconds
  # No temp dirs left behind (Launchpad's job pickles, Reverb's checkpoint dir).
  assert os.listdir(os.path.join(str(tmp_path / 'second'), 'tmp')) == []

  assert f'resumed from checkpoint at learner step {saved}' in second.output
  summary = second.json('summary.json')
  assert summary['stop']['kind'] == 'stop_requested', summary
  assert summary['resumed_from_learner_step'] == saved
  assert summary['learner_steps'] >= saved + 20
  # The curve spans both runs and the learner never went back to step 0.
  steps = [r['learner_steps'] for r in second.progress()]
  restarts = [i for i in range(1, len(steps)) if steps[i] < steps[i - 1]]
  assert all(steps[i] >= saved for i in restarts), (saved, steps)
  assert os.path.exists(os.path.join(logdir, 'curve.png'))
  assert os.path.exists(os.path.join(logdir, 'curve.csv'))
  # Ctrl-C wrote a last checkpoint past the resume (a budget stop also exports the
  # SavedModel: test_central_finish).
  assert checkpointed_learner_step(logdir) >= saved + 20
