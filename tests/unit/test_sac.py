"""SAC's learner and policy on the SEED core (the losses: tests/unit/test_sac_losses.py).

n-step targets from replay items against a literal loop (a termination ends the return,
a time-limit truncation bootstraps from the LAST observation, an item starting on LAST
is dropped); a learner step moves the critics, the actor and the temperature and keeps
the targets a Polyak average; served actions stay inside the bounds and evaluators act
with the mean; SAC refuses discrete actions at start-up; and in a central node the
uniform table's sample-to-insert limiter holds acting to the learner's pace.
"""

import time

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.sac import SACBuilder, SACConfig
from seedacme.agents.sac.learning import SACLearner, n_step_transitions
from seedacme.types import FIRST, LAST, MID, EnvSpec

SPEC = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -2.0), (1.0, 0.5))


def _reference(step_type, reward, discount, gamma, n):
  """Per item: valid, reward sum, bootstrap coefficient, bootstrap index (a loop)."""
  out = []
  for b in range(step_type.shape[0]):
    total, coef, index = 0.0, 1.0, 0
    for j in range(n):
      if step_type[b, j] == LAST:
        break
      total += coef * reward[b, j + 1]
      coef *= gamma * discount[b, j + 1]
      index = j + 1
    out.append((step_type[b, 0] != LAST, total, coef, index))
  return out


@pytest.mark.parametrize('n', [1, 3])
def test_n_step_targets_cut_at_episode_ends(n):
  rng = np.random.default_rng(n)
  b = 12
  step_type = np.full((b, n + 1), MID, np.int8)
  discount = np.ones((b, n + 1), np.float32)
  step_type[0, 0] = LAST  # no transition at all
  step_type[1, min(1, n)] = LAST  # termination at the next step
  discount[1, min(1, n)] = 0.0
  step_type[2, n] = LAST  # truncation at the window's end: discount 1, bootstraps
  step_type[3, n] = FIRST  # a new episode only at the bootstrap step: no effect
  if n > 1:
    step_type[4, 2] = LAST  # truncation inside the window: bootstrap from x_2
    step_type[4, 3] = FIRST
    discount[5, 2] = 0.0  # termination inside the window
    step_type[5, 2] = LAST
  reward = rng.normal(size=(b, n + 1)).astype(np.float32)
  valid, sums, coefs, steps = (x.numpy() for x in n_step_transitions(
      {'step_type': tf.constant(step_type), 'reward': tf.constant(reward),
       'discount': tf.constant(discount)}, n, 0.9))
  for i, (v, total, coef, index) in enumerate(_reference(step_type, reward, discount,
                                                         0.9, n)):
    assert valid[i] == v, i
    if v:
      assert sums[i] == pytest.approx(total, abs=1e-5), i
      assert coefs[i] == pytest.approx(coef, abs=1e-6), i
      assert steps[i] == index, i
  assert coefs[1] == 0.0  # termination: no bootstrap
  assert coefs[2] == pytest.approx(0.9 ** n)  # truncation: bootstrapped


def _batch(n, b=8, seed=0):
  rng = np.random.default_rng(seed)
  step_type = np.full((b, n + 1), MID, np.int8)
  return {'observation': tf.constant(rng.normal(size=(b, n + 1, 5)).astype(np.float32)),
          'reward': tf.constant(rng.normal(size=(b, n + 1)).astype(np.float32)),
          'discount': tf.ones((b, n + 1)), 'step_type': tf.constant(step_type),
          'raw_action': tf.constant(rng.normal(size=(b, n + 1, 2)).astype(np.float32))}


def test_a_learner_step_updates_critics_actor_temperature_and_polyak_targets():
  config = SACConfig(batch_size=8, min_replay_size=8, hidden_sizes=(16,), tau=0.25)
  builder = SACBuilder(config)
  nets = builder.make_networks(SPEC)
  learner = SACLearner(nets, config, None, builder.item_signature(SPEC), builder.layout(SPEC))
  critic = [v.numpy() for v in nets.critics[0].variables]
  target = [v.numpy() for v in nets.targets[0].variables]
  actor = [v.numpy() for v in nets.actor.trainable_variables]
  alpha = float(nets.log_alpha.numpy())
  assert learner.warm_up()
  metrics = learner.train_on(_batch(1))
  assert all(np.isfinite(v) for v in metrics.values())
  new_critic = [v.numpy() for v in nets.critics[0].variables]
  for old, new in zip(critic, new_critic):
    assert not np.array_equal(old, new)
  for old_t, new_c, t in zip(target, new_critic, nets.targets[0].variables):
    np.testing.assert_allclose(t.numpy(), 0.75 * old_t + 0.25 * new_c, rtol=1e-5, atol=1e-6)
  assert any(not np.array_equal(a, v.numpy())
             for a, v in zip(actor, nets.actor.trainable_variables))
  assert float(nets.log_alpha.numpy()) != alpha
  assert learner.num_steps.numpy() == 1


def test_normalized_observations_are_learned_by_the_learner_and_read_by_the_server():
  # observation_normalization=True (the InvertedPendulum test's cause): the learner's
  # step adds its batch's first observations to the statistics, and the served policy,
  # compiled once before, acts on those very statistics (not on a copy taken at trace).
  config = SACConfig(batch_size=8, min_replay_size=8, hidden_sizes=(16,),
                     observation_normalization=True)
  builder = SACBuilder(config)
  nets = builder.make_networks(SPEC)
  learner = SACLearner(nets, config, None, builder.item_signature(SPEC), builder.layout(SPEC))
  policy = builder.make_policy(nets, SPEC, 4, 4)
  obs = (100.0 + np.random.default_rng(1).normal(size=(4, 5))).astype(np.float32)
  everyone = np.ones(4, bool)
  policy.step(np.arange(4), obs, everyone, everyone)  # traced with the initial statistics
  batch = _batch(1)
  batch['observation'] = batch['observation'] * 0.01 + 100.0
  learner.train_on(batch)
  normalizer = nets.actor.normalizer
  assert normalizer.count.numpy() == 8
  np.testing.assert_allclose(normalizer.mean.numpy(), batch['observation'][:, 0].numpy().mean(0),
                             rtol=1e-5)
  (params, _), _ = nets.actor(obs)
  expected = nets.actor.head.to_env(nets.actor.head.mode(params)).numpy()
  served = policy.step(np.arange(4), obs, everyone, everyone).action
  np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)


def test_served_actions_stay_in_bounds_and_evaluators_take_the_mean():
  builder = SACBuilder(SACConfig(hidden_sizes=(16,)))
  nets = builder.make_networks(SPEC)
  policy = builder.make_policy(nets, SPEC, 64, 64)
  obs = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32) * 50
  mask = np.arange(64) % 2 == 0
  first = policy.step(np.arange(64), obs, np.ones(64, bool), mask)
  again = policy.step(np.arange(64), obs, np.ones(64, bool), mask)
  assert (first.action >= [-1.0, -2.0]).all() and (first.action <= [1.0, 0.5]).all()
  np.testing.assert_array_equal(first.action[mask], again.action[mask])
  assert (first.action[~mask] != again.action[~mask]).any()


def test_sac_refuses_discrete_actions_naming_both():
  with pytest.raises(ValueError, match="'sac' cannot serve this env: it has 4 discrete"):
    SACBuilder().check_spec(EnvSpec((3,), 'float32', 4))


@pytest.mark.timeout(180)
def test_samples_per_insert_ties_acting_to_the_learner(make_central, wait_until_stalled):
  spi = 4.0
  config = SACConfig(batch_size=4, min_replay_size=8, replay_size=10_000, hidden_sizes=(16,),
                     samples_per_insert=spi)
  central, client, actors, table = make_central(SACBuilder(config), env='mujoco',
                                                num_actors=1, envs_per_actor=2)
  actor = actors[0]
  actor.start()
  assert wait_until_stalled(actor)
  info = client.server_info()[table].rate_limiter_info
  inserts, samples = info.insert_stats.completed, info.sample_stats.completed
  # error_buffer = max(10 * 4, 8 * 4) = 40: without samples, at most 8 + 40 / 4 inserts.
  assert samples == 0 and 8 <= inserts <= 18, (inserts, samples)
  stalled_at = actor.steps
  time.sleep(1.0)
  assert actor.steps - stalled_at <= 1, 'acting went on without learner steps'
  for _ in range(30):  # each step samples 4 items: one more insert
    assert central.learner.step() is not None
  time.sleep(1.0)
  info = client.server_info()[table].rate_limiter_info
  inserts, samples = info.insert_stats.completed, info.sample_stats.completed
  # 120 sampled by the steps, plus what the dataset's workers took ahead.
  assert samples >= 120 and inserts > 18, (inserts, samples)
  # Reverb's limiter keeps inserts * spi - samples in [min_diff, max_diff] (the error
  # buffer around spi * min_size): acting is held to the learner's pace.
  assert info.min_diff - 1e-6 <= inserts * spi - samples <= info.max_diff + 1e-6, (
      inserts, samples, info.min_diff, info.max_diff)
