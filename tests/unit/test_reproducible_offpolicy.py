"""A seed names an off-policy run too (issue 63, Deliver 2): SAC on InvertedPendulum,
reproducible, gives the same round records and final weights on 2 x 4 and 4 x 2 actors
x envs, with a busy loop beside the second.

In process (`make_central`): the central node's in-process replay
(`seedacme.trajectories.local_replay`) takes each call's items in env-id order and the
learner samples it with a generator keyed by (seed, learner step), in rounds whose
learner steps the samples-per-insert ratio fixes. And the schedule's arithmetic, and
its refusals, on their own.
"""

import functools
import json
import pickle
import threading
import time

import numpy as np
import pytest

from seedacme.agents import r2d2, registry, sac
from seedacme.config import ProgramConfig
from seedacme.trajectories.local_replay import (LocalReplay, LocalReplayBatches,
                                                ReplayRoundSchedule)
from tests.unit.in_process import InProcessActor, run_to_its_end

STEPS = 24  # learner steps: 2 per round after the warm-up


def _sac_pendulum():
  # 8 envs, 8 samples per insert, batches of 32: 2 learner steps per round of one call;
  # learning once the replay holds 64 transitions (after round 7).
  return sac.SACBuilder(registry.make_config(
      'sac', 'mujoco', hidden_sizes=(32, 32), batch_size=32, min_replay_size=64,
      samples_per_insert=8.0, sgd_steps_per_sample=1, seed=3))


def _run(make_central, tmp_path, num_actors, envs_per_actor, busy=0,
         builder_fn=_sac_pendulum, env='mujoco', steps=STEPS, lag=0):
  logdir = tmp_path / f'{env}-{num_actors}x{envs_per_actor}-busy{busy}-lag{lag}'
  central, _, actors, _ = make_central(
      builder_fn(), env, num_actors, envs_per_actor,
      env_options={'level': 'InvertedPendulum-v5'} if env == 'mujoco' else None,
      reproducible=True, reproducible_lag=lag, max_learner_steps=steps,
      checkpoint_interval_s=None,
      export_policy=False,
      logdir=str(logdir), progress_interval_s=1.0, seed=3)
  return run_to_its_end(central, actors, logdir, busy), central.summary, central


@pytest.mark.timeout(240)
def test_sac_pendulum_is_the_same_run_on_any_split(make_central, tmp_path):
  first, summary, central = _run(make_central, tmp_path, 2, 4)
  assert summary['stop']['kind'] == 'learner_steps', summary['stopped_because']
  assert summary['reproducible'] and summary['exact_until_round'] is None, summary
  schedule = central.rounds.schedule
  assert (schedule.unroll_length, schedule.steps_per_round,
          schedule.warm_up_rounds) == (1, 2, 7)
  # Round r acts after 2 * max(0, r - 7) steps; the run ends at the round reaching 24.
  assert [r['learner_steps'] for r in first] == \
      [2 * max(0, r - 7) for r in range(7 + STEPS // 2 + 1)]
  assert first[-1]['episodes'] > 0
  losses = [r['learner_critic_loss'] for r in first[8:]]
  assert len(set(losses)) == len(losses), losses
  # Every call's items went to the in-process replay, none to Reverb's table.
  replay = central._builder.local_replay()  # pylint: disable=protected-access
  assert replay.calls == schedule.last_call(len(first) - 2) + 1
  assert replay.size == 8 * (replay.calls - 1)
  rounds, other, _ = _run(make_central, tmp_path, 4, 2, busy=1)
  assert rounds == first
  assert other['weights_sha256'] == summary['weights_sha256']


EVERY = 5  # checkpoint_rounds of the resumed run


def _start_resumable(make_central, logdir, split, checkpoints, agent='sac'):
  """A reproducible SAC (or R2D2) run to `STEPS` with round checkpoints every `EVERY`
  rounds (or none), its actors handing in their envs at checkpoint rounds; started."""
  builder = _sac_pendulum() if agent == 'sac' else _r2d2_cartpole()
  env = 'mujoco' if agent == 'sac' else 'cartpole'
  round_length = builder.round_schedule(split[0] * split[1]).unroll_length
  central, _, actors, _ = make_central(
      builder, env, *split,
      env_options={'level': 'InvertedPendulum-v5'} if agent == 'sac' else None,
      reproducible=True, max_learner_steps=STEPS,
      checkpoint_interval_s=3600.0 if checkpoints else None, checkpoint_rounds=EVERY,
      export_policy=False, logdir=str(logdir), progress_interval_s=1.0, seed=3,
      actor=functools.partial(InProcessActor, snapshots=(round_length, EVERY)))
  for a in actors:
    a.start()
  return central, actors


def _records(logdir):
  with open(logdir / 'rounds.jsonl') as f:
    return [json.loads(line) for line in f]


@pytest.mark.timeout(240)
@pytest.mark.parametrize('agent, splits, per_round, warm_up', [
    ('sac', ((2, 4), (4, 2)), 8, 7),  # rounds of 1 call, 8 transitions
    ('r2d2', ((2, 8), (4, 4)), 16, 5),  # rounds of 5 calls, 16 sequences
])
def test_resumed_at_a_round_checkpoint_is_the_uninterrupted_run(
    make_central, tmp_path, agent, splits, per_round, warm_up):
  """The replay is in the round checkpoint: run B, stopped two rounds past its
  checkpoint at round 10 (learning since round warm_up + 1) and resumed on another
  split, is run A."""
  central, actors = _start_resumable(make_central, tmp_path / 'a', splits[0], False, agent)
  central.run()
  whole, summary_a = _records(tmp_path / 'a'), central.summary
  assert summary_a['exact_until_round'] is None, summary_a['not_exact_because']
  b = tmp_path / 'b'
  central, actors = _start_resumable(make_central, b, splits[0], True, agent)
  stop = actors[0].stop

  def watch():
    deadline = time.monotonic() + 120
    while central.rounds.round < 2 * EVERY + 2 and time.monotonic() < deadline:
      time.sleep(0.01)
    stop.set()
  threading.Thread(target=watch, daemon=True).start()
  central.run()
  assert central.summary['stop']['kind'] == 'stop_requested'
  schedule = central.rounds.schedule
  assert schedule.warm_up_rounds == warm_up
  with open(b / 'checkpoints' / 'rounds' / f'round-{2 * EVERY}.pkl', 'rb') as f:
    saved = pickle.load(f)['server']['sink']['replay']
  assert len(saved['after_call']) == schedule.first_call(2 * EVERY)
  assert saved['count'] == schedule.items_through(2 * EVERY - 1)
  assert saved['count'] - schedule.items_through(2 * EVERY - 2) == per_round
  central, actors = _start_resumable(make_central, b, splits[1], True, agent)
  central.run()
  assert central.resumed_round == 2 * EVERY
  assert central.summary['exact_until_round'] is None, central.summary['not_exact_because']
  assert _records(b) == whole
  assert central.summary['weights_sha256'] == summary_a['weights_sha256']


def test_replay_schedule_arithmetic():
  # SAC's MuJoCo defaults on 2 x 4: 256 samples per insert, batches of 4 x 256.
  s = ReplayRoundSchedule(8, 256.0, 256, 4, 2, 5000, lag=0)
  assert (s.unroll_length, s.steps_per_round, s.warm_up_rounds) == (1, 8, 624)
  assert s.items_through(623) == 4992 and s.items_through(624) == 5000
  assert [s.learner_steps_for(r) for r in (0, 624, 625, 626)] == [0, 0, 8, 16]
  assert [s.first_round_after(j) for j in (0, 7, 8)] == [624, 624, 625]
  # Two envs: a round of 2 calls makes 4 inserts, 1024 samples, one call of 4 steps.
  s = ReplayRoundSchedule(2, 256.0, 256, 4, 2, 1024, lag=1)
  assert (s.unroll_length, s.steps_per_round) == (2, 4)
  assert s.learner_steps_for(s.warm_up_rounds + 1) == 0
  assert s.learner_steps_for(s.warm_up_rounds + 2) == 4
  # n-step items: the first n calls of each env end none.
  s = ReplayRoundSchedule(4, 4.0, 16, 1, 4, 16, lag=0)
  assert [s.items_through(r) for r in range(3)] == [0, 0, 4]
  with pytest.raises(ValueError, match='samples_per_insert'):
    ReplayRoundSchedule(8, None, 256, 1, 2, 5000)
  with pytest.raises(ValueError, match='simple fraction'):
    ReplayRoundSchedule(8, 256.0 / 9973, 256, 1, 2, 5000)


def test_local_replay_windows_are_the_items_after_a_call():
  replay = LocalReplay(capacity=5)
  for call in range(4):
    replay.add_call([{'x': np.full(2, call * 10 + e), 'y': (np.int8(e),)}
                     for e in range(2)])
  assert replay.window(1, 0.0) == (0, 4)
  assert replay.window(3, 0.0) == (3, 8)  # the newest 5
  assert replay.window(4, 0.05) is None  # not in yet
  batch = replay.take(np.array([3, 7]), keep_from=3)
  assert batch['x'].tolist() == [[11, 11], [31, 31]] and batch['y'][0].tolist() == [1, 1]
  with pytest.raises(RuntimeError, match='dropped'):
    replay.take(np.array([2]), keep_from=3)
  # A round checkpoint's state continues the same replay (items, counts, priorities).
  again = LocalReplay(capacity=5)
  again.load_state(replay.state())
  assert again.restored and again.calls == 4 and again.window(3, 0.0) == (3, 8)
  again.add_call([{'x': np.full(2, 40), 'y': (np.int8(0),)}])
  assert again.take(np.array([7, 8]), keep_from=4)['x'][:, 0].tolist() == [31, 40]


@pytest.mark.timeout(240)
def test_sac_lag_1_is_the_same_run_on_any_split(make_central, tmp_path):
  """Round r acts while the learner trains on round r - 1's window: items the acting
  round adds meanwhile are outside it."""
  first, summary, _ = _run(make_central, tmp_path, 2, 4, lag=1, steps=12)
  assert summary['exact_until_round'] is None, summary
  assert [r['learner_steps'] for r in first] == \
      [2 * max(0, r - 8) for r in range(8 + 12 // 2 + 1)]
  rounds, other, _ = _run(make_central, tmp_path, 4, 2, lag=1, steps=12)
  assert rounds == first
  assert other['weights_sha256'] == summary['weights_sha256']


R2D2_STEPS = 20


def _r2d2_cartpole():
  # 16 envs, sequences of 4 + 10 + 1 steps every 5 calls, 4 samples per insert, batches
  # of 32: rounds of 5 calls, 2 learner steps each; learning once the replay holds 64
  # sequences (after round 5).
  return r2d2.R2D2Builder(registry.make_config(
      'r2d2', 'cartpole', burn_in=4, trace_length=10, period=5, hidden_sizes=(32,),
      lstm_size=32, batch_size=32, min_replay_size=64, samples_per_insert=4.0,
      target_update_period=4, seed=3))


@pytest.mark.timeout(240)
def test_r2d2_cartpole_is_the_same_run_on_any_split(make_central, tmp_path):
  runs = []
  for num_actors, envs_per_actor, busy in ((2, 8, 0), (4, 4, 1)):
    runs.append(_run(make_central, tmp_path, num_actors, envs_per_actor, busy,
                     builder_fn=_r2d2_cartpole, env='cartpole', steps=R2D2_STEPS))
  (first, summary, central), (rounds, other, _) = runs
  assert summary['stop']['kind'] == 'learner_steps', summary['stopped_because']
  assert summary['exact_until_round'] is None, summary
  schedule = central.rounds.schedule
  assert (schedule.unroll_length, schedule.steps_per_round,
          schedule.warm_up_rounds) == (5, 2, 5)
  assert [r['learner_steps'] for r in first] == \
      [2 * max(0, r - 5) for r in range(5 + R2D2_STEPS // 2 + 1)]
  assert first[-1]['episodes'] > 0
  # Every step's priorities went back to the replay (the learner's count of them).
  assert first[-1]['learner_priority_updates'] == 32 * R2D2_STEPS
  losses = [r['learner_loss'] for r in first[6:]]
  assert len(set(losses)) == len(losses), losses
  assert rounds == first
  assert other['weights_sha256'] == summary['weights_sha256']


def test_prioritized_draws_follow_priorities_and_their_updates():
  schedule = ReplayRoundSchedule(2, 1.0, 2, 1, 1, 2, item_period=1)
  replay = LocalReplay(capacity=10)
  replay.add_call([np.zeros(1), np.ones(1)], [1.0, 0.0])
  replay.add_call([np.zeros(1), np.ones(1)], [3.0, 0.0])
  batches = LocalReplayBatches(replay, schedule, seed=3, sample_size=4000,
                               priority_exponent=1.0)
  keys, probability = batches.draw(0, 0, 4, 4000)
  assert set(keys.tolist()) == {0, 2}  # priority 0: never drawn
  assert set(probability.tolist()) == {0.25, 0.75}
  assert abs((keys == 2).mean() - 0.75) < 0.03
  again, _ = batches.draw(0, 0, 4, 4000)
  assert np.array_equal(keys, again)  # (seed, step) names the draw
  assert not np.array_equal(keys, batches.draw(1, 0, 4, 4000)[0])
  # The learner's update: the next draw follows it (a dropped key is skipped).
  assert batches.update_priorities(np.array([2, 1]), np.array([0.0, 1.0])) == 2
  keys, _ = batches.draw(2, 0, 4, 100)
  assert set(keys.tolist()) == {0, 1}


def test_an_off_policy_run_without_a_ratio_is_refused_by_name():
  """R2D2's defaults leave samples_per_insert unset: the learner steps per round would
  be unknown."""
  config = ProgramConfig(num_actors=2, envs_per_actor=8, num_eval_envs=0,
                         reproducible=True)
  with pytest.raises(ValueError, match=r'samples_per_insert=None.*--agent_config'):
    config.check_reproducible(r2d2.R2D2Builder(registry.make_config('r2d2', 'cartpole')))
  config.check_reproducible(r2d2.R2D2Builder(registry.make_config(
      'r2d2', 'cartpole', samples_per_insert=4.0)))
  config.check_reproducible(sac.SACBuilder(registry.make_config('sac', 'mujoco')))
