"""The central node in one process: real Reverb server, inference server, learners.

No Launchpad here (see tests/integration for the real program): actors are threads
calling `CentralNode.step` directly. Checks that unrolls reach the Reverb queue with the
right shapes (feed-forward and LSTM), that learner steps consume them, that a full queue
blocks inference (backpressure) until the learner catches up, that returns rise, that
R2D2's learner writes new priorities back into its prioritized table, and that R2D2's
`samples_per_insert` limiter holds acting to the learner's pace.
"""

import time

import numpy as np
import pytest


from seedacme.agents import vtrace


def _table_size(client, table):
  return client.server_info()[table].current_size


@pytest.mark.timeout(120)
@pytest.mark.parametrize('core', ['feedforward', 'lstm'])
def test_unrolls_flow_from_inference_to_learner(make_central, core):
  cfg = vtrace.VTraceConfig(core=core, unroll_length=5, batch_size=4,
                            hidden_sizes=(16,), lstm_size=8, queue_size=64)
  central, client, actors, table = make_central(cfg, num_actors=1, envs_per_actor=4)
  for a in actors:
    a.start()
  deadline = time.monotonic() + 60
  while _table_size(client, table) < 8 and time.monotonic() < deadline:
    time.sleep(0.05)
  assert _table_size(client, table) >= 8
  sample = next(client.sample(table, emit_timesteps=False, unpack_as_table_signature=True)).data
  assert sample['observation'].shape == (6, 10, 5)  # T + 1 steps
  assert sample['logits'].shape == (6, 3)
  if core == 'lstm':
    assert [x.shape for x in sample['initial_state']] == [(8,), (8,)]
  else:
    assert 'initial_state' not in sample
  assert central.learner.warm_up()  # the step is traced before any batch
  metrics = central.learner.step()
  assert metrics is not None and np.isfinite(metrics['loss'])
  assert 0.0 < metrics['mean_rho'] < 10.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize('replay_answers_after_s', [0.0, 4.0])
def test_full_queue_blocks_inference_until_the_learner_samples(
    make_central, monkeypatch, replay_answers_after_s):
  # A replay node that answers late (still starting, as under CI's load) lets the
  # writer's queue fill first, so its first stream flush carries a full batch of 32
  # items: more than the learner's first step frees. That case stalled this test once.
  from seedacme.trajectories.writer import ReverbSequenceWriter  # pylint: disable=g-import-not-at-top
  reachable = ReverbSequenceWriter.server_reachable
  started = time.monotonic()
  monkeypatch.setattr(
      ReverbSequenceWriter, 'server_reachable',
      lambda self, timeout_s=2: (time.monotonic() - started >= replay_answers_after_s
                                 and reachable(self, timeout_s)))
  cfg = vtrace.VTraceConfig(unroll_length=2, batch_size=4, queue_size=4)
  central, client, actors, table = make_central(cfg, num_actors=1, envs_per_actor=4)
  actor = actors[0]
  actor.start()
  deadline = time.monotonic() + 30
  while _table_size(client, table) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
  time.sleep(1.0)
  stalled_at = actor.steps
  time.sleep(1.5)
  # Queue full and writer's buffer full: inference blocks, the actor waits.
  assert _table_size(client, table) == 4
  assert actor.steps - stalled_at <= 1
  # The learner takes 4 unrolls per step. The writer flushes items in batches (up to
  # 32 per stream flush) and a batch may hold more than the 4 freed slots: how many
  # learner steps release the actor depends on where its batch ended. It must happen
  # within 32 / 4 + 1 steps, and the table must refill in between (the writer goes on).
  learner_steps = 0
  while actor.steps <= stalled_at + 1 and learner_steps < 9:
    metrics = central.learner.step()
    assert learner_steps or metrics is not None  # the full queue gives a first batch
    learner_steps += 1
    deadline = time.monotonic() + 3
    while actor.steps <= stalled_at + 1 and time.monotonic() < deadline:
      time.sleep(0.05)
  assert actor.steps > stalled_at + 1, f'actor still stalled after {learner_steps} learner steps'
  assert actor.error is None


@pytest.mark.timeout(150)
def test_returns_rise_on_catch(make_central, learn_until):
  cfg = vtrace.VTraceConfig(unroll_length=20, batch_size=16, learning_rate=2e-3)
  central, _, actors, _ = make_central(cfg, num_actors=2, envs_per_actor=8)
  for a in actors:
    a.start()
  first, summary = learn_until(central, 0.8, first_after_episodes=100, timeout_s=110)
  assert first is not None
  assert summary['average_return'] >= 0.8 > first, (first, summary)
  assert all(a.error is None for a in actors)


def _sampled_priorities(client, table, n):
  out = {}
  for sample in client.sample(table, num_samples=n, emit_timesteps=False):
    out[int(sample.info.key)] = float(sample.info.priority)
  return out


@pytest.mark.timeout(120)
def test_r2d2_writes_new_priorities_back_to_reverb(make_central):
  from seedacme.agents import r2d2
  cfg = r2d2.R2D2Config(burn_in=2, trace_length=6, period=4, n_step=3, hidden_sizes=(16,),
                        lstm_size=16, batch_size=16, min_replay_size=32, replay_size=10_000,
                        target_update_period=5)
  central, client, actors, table = make_central(r2d2.R2D2Builder(cfg), num_actors=1,
                                                envs_per_actor=4)
  actors[0].start()
  deadline = time.monotonic() + 60
  while _table_size(client, table) < 64 and time.monotonic() < deadline:
    time.sleep(0.05)
  actors[0].stop.set()  # freeze the table's contents ...
  actors[0].join(10)
  assert central.server.trajectory_sink.wait_until_written(10)  # ... once in-flight items land
  size = _table_size(client, table)
  before = _sampled_priorities(client, table, 4 * size)
  assert len(set(before.values())) > 1  # initial priorities are TD estimates, not constants
  assert central.learner.warm_up()  # the step is traced before any batch
  # A step returns None when no batch came within the dataset's 1 s (the learner loop
  # then asks again): on a loaded machine the first sample can take longer.
  steps, deadline = 0, time.monotonic() + 60
  while steps < 5 and time.monotonic() < deadline:
    steps += central.learner.step() is not None
  assert steps == 5
  assert central.learner.priority_updates == 5 * 16
  after = _sampled_priorities(client, table, 4 * size)
  changed = [k for k in before.keys() & after.keys() if abs(before[k] - after[k]) > 1e-7]
  assert changed, 'no sampled item got a new priority'
  assert _table_size(client, table) == size  # prioritized replay keeps its items


def _limiter_counts(client, table):
  """(inserts, samples, the limiter's max_diff) of `table`."""
  info = client.server_info()[table]
  limiter = info.rate_limiter_info
  return (limiter.insert_stats.completed, limiter.sample_stats.completed, limiter.max_diff)


@pytest.mark.timeout(150)
def test_samples_per_insert_ties_acting_to_the_learner(make_central, wait_until_stalled):
  # R2D2's `samples_per_insert` holds acting back until the learner has sampled each
  # inserted sequence that often: the writer's flush waits, so inference and the
  # actor wait too (nothing is dropped), and learner steps release them.
  from seedacme.agents import r2d2
  spi = 2.0
  cfg = r2d2.R2D2Config(burn_in=0, trace_length=4, period=2, n_step=2, hidden_sizes=(16,),
                        lstm_size=8, batch_size=4, min_replay_size=8, replay_size=10_000,
                        samples_per_insert=spi)
  central, client, actors, table = make_central(r2d2.R2D2Builder(cfg), num_actors=1,
                                                envs_per_actor=4)
  actor = actors[0]
  actor.start()
  # Without learner steps the table stops at min_replay_size + error_buffer / spi
  # (8 + 40 / 2 = 28 inserts) and the actor stalls once the writer's queue is full.
  assert wait_until_stalled(actor)
  inserts, samples, max_diff = _limiter_counts(client, table)
  assert samples == 0 and 8 <= inserts <= 28, (inserts, samples)
  assert (inserts + 1) * spi - samples > max_diff  # the next insert must wait
  stalled_at = actor.steps
  time.sleep(1.0)
  assert actor.steps - stalled_at <= 1, 'acting went on without learner steps'
  assert _limiter_counts(client, table)[0] == inserts
  # Each learner step samples 4 sequences, which admits 2 more inserts; a stream
  # flush may carry up to 32 items, so releasing the actor takes up to 32 / 2 steps.
  assert central.learner.warm_up()
  steps = 0
  while actor.steps <= stalled_at + 1 and steps < 20:
    assert central.learner.step() is not None
    steps += 1
    wait_until = time.monotonic() + 2
    while actor.steps <= stalled_at + 1 and time.monotonic() < wait_until:
      time.sleep(0.05)
  assert actor.steps > stalled_at + 1, f'actor still stalled after {steps} learner steps'
  inserts_after, samples_after, _ = _limiter_counts(client, table)
  assert samples_after >= 4 * steps  # the dataset samples ahead (in flight, prefetch)
  assert inserts < inserts_after <= 28 + samples_after / spi + 1
  assert actor.error is None
