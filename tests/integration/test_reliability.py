"""Crashes mid-run: a killed actor or central node comes back and training goes on."""

import os
import re
import signal
import time

import pytest

from tests.integration.launch import (Run, wait_for, checkpointed_learner_step, leftover_processes,
                                      supervised_child, target_value)

pytestmark = pytest.mark.integration


def _wait_for_learning(run: Run) -> None:
  learning = lambda: any(r['learner_steps'] > 0 for r in run.progress())  # noqa: E731
  assert wait_for(learning, 150, run), run.output[-3000:]


def _kill_child(run: Run, node: str) -> int:
  """SIGKILLs the process doing `node`'s work (its supervisor stays); returns its pid."""
  victim = supervised_child(run, node)
  os.kill(victim, signal.SIGKILL)
  return victim


def _wait_for_log(run: Run, node: str, text: str, timeout: float = 60) -> None:
  assert wait_for(lambda: text in run.node_log(node), timeout, run), \
      run.node_log(node)[-3000:]


def _restarted_once(run: Run, node: str, victim: int) -> bool:
  return re.search(rf'child {victim} died \(exit code -9\)( after \d+s)?; restart #1',
                   run.node_log(node)) is not None


@pytest.mark.long('learns Catch to 0.9 through three kills: ~2 min, up to 6 under load')
@pytest.mark.timeout(540)
def test_killed_central_actor_and_replay_come_back_and_catch_is_learned(tmp_path):
  """One program, the node-kill family in turn (each was a program of its own, ~80 s
  each): SIGKILL the central node's child (it restores the checkpoint and the actors
  reconnect through a new shared-memory generation), then an actor's (the server sees new
  run ids and resets its envs), then the replay's (the standby serves the same port at
  once, writer and dataset go on); then V-trace still learns Catch to 0.9."""
  logdir = os.path.join(str(tmp_path), 'logdir')
  with Run(['catch', 'vtrace', '2', '8', '--max_seconds', '400', '--target_return', '0.9',
            '--checkpoint_interval_s', '2', '--progress_interval_s', '1',
            '--standby_restarts'], str(tmp_path), logdir=logdir) as run:
    # 1. The central node, once a checkpoint exists.
    saved_any = lambda: (checkpointed_learner_step(logdir) or 0) > 0  # noqa: E731
    assert wait_for(saved_any, 150, run), run.output[-3000:]
    central = _kill_child(run, 'learner/0')
    saved = checkpointed_learner_step(logdir)
    _wait_for_log(run, 'learner/0', 'Restored checkpoint', timeout=120)
    # The actor is attached to the new central node (its second generation) before it
    # dies, so the new node knows its run id and sees it change.
    attached = lambda: len(set(re.findall(  # noqa: E731
        r'requests through shared memory \(segment of \d+ envs, generation (\d+)\)',
        run.node_log('actor/0')))) == 2
    assert wait_for(attached, 120, run), run.node_log('actor/0')[-3000:]
    _wait_for_learning(run)
    # 2. An actor.
    actor = _kill_child(run, 'actor/0')
    _wait_for_log(run, 'learner/0', 'Run id changed for 8 envs (actor restart)')
    # 3. The replay node: its standby takes over on the same port.
    _wait_for_log(run, 'replay/0', 'started standby process')
    replay = _kill_child(run, 'replay/0')
    _wait_for_log(run, 'replay/0', 'takes over', timeout=30)
    steps_after_replay = run.progress()[-1]['learner_steps']
    run.complete(400)
  summary = run.json('summary.json')
  # Central: restarted once, from the checkpoint (not from 0); actors went on with it.
  assert _restarted_once(run, 'learner/0', central)
  resumed = [int(line.rsplit('learner step ', 1)[1].split(',')[0])
             for line in run.output.splitlines() if 'resumed from checkpoint' in line]
  assert resumed and resumed[-1] >= saved
  assert summary['resumed_from_learner_step'] == resumed[-1]
  assert 'the inference server went away' in run.node_log('actor/0')
  # Actor: restarted once and counted.
  assert _restarted_once(run, 'actor/0', actor)
  assert summary['actor_restarts'] >= 1
  # Replay: restarted once; one line when it went and one when back, no error storm.
  assert _restarted_once(run, 'replay/0', replay)
  assert _replay_log_count(run, 'unreachable') <= 2, run.node_log('learner/0')[-3000:]
  assert _replay_log_count(run, 'Traceback') == 0
  assert summary['trajectory_writer_reconnects'] <= 1
  assert summary['learner_steps'] > steps_after_replay
  # And it learned.
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary
  assert target_value(summary) >= 0.9


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
  with Run(['catch', 'vtrace', '2', '16', '--max_seconds', '75', '--learner_step_delay_s',
            '0.5', '--num_eval_envs', '0', '--progress_interval_s', '2'], str(tmp_path)) as run:
    full = lambda: any((r.get('replay_size') or 0) >= 256 for r in run.progress())  # noqa: E731
    assert wait_for(full, 150, run), run.output[-3000:]  # the queue filled up ...
    time.sleep(5)
    first = _rss_mb(leftover_processes(run.tag))
    records_then = run.progress()
    time.sleep(30)
    second = _rss_mb(leftover_processes(run.tag))
    records_now = run.progress()
    run.interrupt()  # the point is made; the rest of the budget would only cost time
    run.complete(60)
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


def _replay_log_count(run: Run, text: str) -> int:
  return sum(text in line for line in run.node_log('learner/0').splitlines())


def _replay_checkpoints(run: Run) -> list:
  """Reverb checkpoints in the replay node's directory (`<logdir>/replay`: the run
  checkpoints, so its replay is kept for a resume)."""
  root = os.path.join(run.logdir, 'replay')
  return [os.path.join(root, c) for c in os.listdir(root)] if os.path.isdir(root) else []


@pytest.mark.timeout(300)
@pytest.mark.parametrize('program', [
    ['catch', 'r2d2', '2', '16'],
    # SAC's uniform replay, checkpointed the same way (continuous control).
    pytest.param(['mujoco', 'sac', '2', '4', '--level', 'InvertedPendulum-v5',
                  '--agent_config', 'batch_size=32', '--agent_config',
                  'samples_per_insert=8'],
                 marks=pytest.mark.long('the R2D2 case\'s restore for SAC\'s uniform replay, '
                                        'a second program: ~75 s'), id='sac'),
], ids=['r2d2', None])
def test_killed_replay_node_restores_the_replay_from_its_checkpoint(tmp_path, program):
  with Run(program + ['--max_seconds', '85', '--num_eval_envs', '0',
                      '--progress_interval_s', '1', '--agent_config',
                      'replay_checkpoint_interval_s=3', '--agent_config',
                      'min_replay_size=200'], str(tmp_path)) as run:
    ready = lambda: (any(r['learner_steps'] > 0 for r in run.progress())  # noqa: E731
                     and _replay_checkpoints(run))
    assert wait_for(ready, 150, run), run.output[-3000:]
    time.sleep(4)  # a checkpoint taken while learning
    victim = _kill_child(run, 'replay/0')
    _wait_for_log(run, 'replay/0', 'restored the latest checkpoint')
    steps_after_restart = run.progress()[-1]['learner_steps']
    # Learning goes on from the restored replay; then Ctrl-C (not the whole budget: the
    # test's point is made, and the suite's time counts).
    assert wait_for(lambda: run.progress()[-1]['learner_steps'] > steps_after_restart + 2,
                    60, run), run.output[-3000:]
    run.interrupt()
    run.complete(60)
  assert _restarted_once(run, 'replay/0', victim)
  replay_log = run.node_log('replay/0')
  line = next(x for x in replay_log.splitlines() if 'restored the latest checkpoint' in x)
  restored_size = int(line.rsplit(':', 1)[1].strip(' }'))
  assert restored_size >= 200, line  # the replay came back full, not empty
  summary = run.json('summary.json')
  assert summary['learner_steps'] > steps_after_restart  # learning went on
  if program[1] == 'r2d2':
    assert summary['learner_priority_updates'] > 0
  assert not os.listdir(os.path.join(os.path.dirname(run.logdir), 'tmp')) or \
      not any(d.startswith('seedacme_reverb_')
              for d in os.listdir(os.path.join(os.path.dirname(run.logdir), 'tmp')))
  assert _replay_checkpoints(run)  # kept in the logdir: a resumed run reloads it
