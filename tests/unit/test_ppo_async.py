"""PPO in an asynchronous system (issue 36), with a real learner and a real policy.

- Data of zero lag is evaluated by the learner exactly as the policy acted on it
  (ratio 1 on the first minibatch), observation normalization on: the statistics
  change after the epochs, with the weights.
- On stale data the decoupled objective's ratio starts at 1 (the proximal policy is
  the network as the batch arrives) and the staleness shows in the behaviour weight;
  plain PPO-clip starts away from 1.
- The reward normalizer's discounted return runs on per env across unrolls: checked
  against a numpy reference over whole episodes that are then split into unrolls.
"""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.ppo import PPOBuilder, PPOConfig
from seedacme.agents.ppo.learning import PPOLearner
from seedacme.types import FIRST, LAST, MID, EnvSpec

SPEC = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -2.0), (1.0, 0.5))


def _setup(**overrides):
  config = PPOConfig(**{**dict(unroll_length=8, batch_size=4, epochs=1, num_minibatches=1,
                               hidden_sizes=(16,), normalize_observations=True,
                               learning_rate=3e-3), **overrides})
  builder = PPOBuilder(config)
  network = builder.make_networks(SPEC)
  learner = PPOLearner(network, config, None, builder.item_signature(SPEC))
  policy = builder.make_policy(network, SPEC, config.batch_size, config.batch_size)
  return builder, config, network, learner, policy


def _acted_batch(builder, config, policy, rng, mean):
  """`batch_size` unrolls acted by the policy (sampled actions), as the queue holds
  them: observations drawn around `mean` (far from the statistics so far)."""
  B, n = config.batch_size, config.unroll_length + 1
  observation = rng.normal(mean, 2.0, (B, n) + SPEC.observation_shape).astype(np.float32)
  steps = [policy.step(np.arange(B), observation[:, t], np.full(B, t == 0), np.zeros(B, bool))
           for t in range(n)]
  step_type = np.full((B, n), MID, np.int8)
  step_type[:, 0] = FIRST
  batch = {'observation': observation, 'step_type': step_type,
           'reward': rng.normal(size=(B, n)).astype(np.float32),
           'discount': np.ones((B, n), np.float32),
           'action': np.stack([s.action for s in steps], 1)}
  for name in steps[0].extras:
    batch[name] = np.stack([s.extras[name] for s in steps], 1)
  assert set(batch) == set(builder.item_signature(SPEC))
  return {k: tf.constant(v) for k, v in batch.items()}


@pytest.mark.parametrize('objective', ['clip', 'decoupled'])
def test_fresh_data_has_ratio_one_with_normalized_observations(objective):
  builder, config, network, learner, policy = _setup(objective=objective)
  rng = np.random.default_rng(0)
  for step in range(2):  # statistics and weights away from their initial values
    learner.train_on(_acted_batch(builder, config, policy, rng, mean=1.0 + step))
  assert network.normalizer.count.numpy() > 0
  batch = _acted_batch(builder, config, policy, rng, mean=6.0)  # zero lag
  assert (batch['policy_version'].numpy() == learner.num_steps.numpy()).all()
  mean_before = network.normalizer.mean.numpy().copy()
  metrics = learner.train_on(batch)  # one minibatch: the first one's metrics
  # Learner-side log-probs of the behaviour actions equal the policy's: both the ratio
  # the surrogate sees and the proximal policy's weight against the behaviour are 1.
  assert metrics['mean_ratio'] == pytest.approx(1.0, abs=1e-5)
  assert metrics['clip_fraction'] == 0.0
  assert metrics['approx_kl'] == pytest.approx(0.0, abs=1e-8)
  assert metrics['behaviour_kl'] == pytest.approx(0.0, abs=1e-8)
  assert metrics['behaviour_weight'] == pytest.approx(1.0, abs=1e-5)
  # The batch's observations reached the statistics (after the epochs).
  assert np.abs(network.normalizer.mean.numpy() - mean_before).max() > 0.5


@pytest.mark.parametrize('objective', ['clip', 'decoupled'])
def test_stale_data_is_clipped_around_the_proximal_policy(objective):
  builder, config, _, learner, policy = _setup(objective=objective)
  rng = np.random.default_rng(1)
  stale = _acted_batch(builder, config, policy, rng, mean=0.0)
  for _ in range(3):  # the learner moves on: `stale` is 3 learner steps old
    learner.train_on(_acted_batch(builder, config, policy, rng, mean=0.0))
  metrics = learner.train_on(stale)  # one minibatch: the first one's metrics
  assert metrics['policy_lag'] == 3.0
  assert metrics['behaviour_kl'] > 1e-4  # the data is stale
  if objective == 'decoupled':  # centred on the network as the batch arrived
    assert metrics['mean_ratio'] == pytest.approx(1.0, abs=1e-5)
    assert metrics['approx_kl'] == pytest.approx(0.0, abs=1e-8)
    assert metrics['clip_fraction'] == 0.0
    assert metrics['behaviour_weight'] < 1.0  # truncated at c_bar = 1
  else:  # centred on the behaviour policy, 3 steps old: the first step starts away
    assert metrics['approx_kl'] > 1e-4
    assert metrics['approx_kl'] == pytest.approx(metrics['behaviour_kl'], rel=1e-3)
  # Against the proximal policy the first minibatch has not moved, whatever the anchor.
  assert metrics['proximal_clip_fraction'] == 0.0
  assert metrics['proximal_approx_kl'] == pytest.approx(0.0, abs=1e-8)


# ---- the reward normalizer's return, per env across unrolls --------------------------
GAMMA = 0.9


def _env_stream(rng, num_steps):
  """One env's steps: episodes of random lengths, ended by terminations (discount 0)
  or truncations (discount 1); rewards of scale 3 and mean 1."""
  step_type, reward, discount = [], [], []
  while len(step_type) < num_steps:
    length = int(rng.integers(3, 25))
    step_type += [FIRST] + [MID] * (length - 2) + [LAST]
    reward += [0.0] + list(rng.normal(1.0, 3.0, length - 1))
    discount += [1.0] * (length - 1) + [float(rng.random() < 0.5)]
  return (np.array(step_type[:num_steps], np.int8), np.array(reward[:num_steps], np.float32),
          np.array(discount[:num_steps], np.float32))


def _reference_returns(step_type, reward):
  """gymnasium's NormalizeReward return over the whole stream, written per episode:
  at each transition, the discounted sum of the episode's rewards so far."""
  returns = []
  episode = []
  for t in range(len(step_type) - 1):
    if step_type[t] == FIRST:
      episode = []
    if step_type[t] == LAST:
      continue  # LAST -> FIRST is no transition
    episode.append(reward[t + 1])
    k = len(episode)
    returns.append(sum(GAMMA ** (k - 1 - j) * r for j, r in enumerate(episode)))
  return returns


def test_reward_normalizer_return_runs_on_across_unrolls():
  T, B, E, K = 10, 4, 3, 4  # 3 envs, 4 unrolls each, 3 batches of 4 unrolls
  config = PPOConfig(unroll_length=T, batch_size=B, num_minibatches=1, hidden_sizes=(8,),
                     normalize_rewards=True, discount=GAMMA)
  builder = PPOBuilder(config)
  network = builder.make_networks(SPEC)
  learner = PPOLearner(network, config, None, builder.item_signature(SPEC))
  rng = np.random.default_rng(0)
  streams = [_env_stream(rng, T * K + 1) for _ in range(E)]
  expected = np.concatenate([_reference_returns(s[0], s[1]) for s in streams])
  # Each env's unrolls in order; env 0's first two in one batch.
  order = [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1), (2, 1), (0, 2), (1, 2),
           (2, 2), (0, 3), (1, 3), (2, 3)]
  template = {k: v.numpy() for k, v in _acted_like(builder, config).items()}
  for first in range(0, len(order), B):
    batch = {k: v.copy() for k, v in template.items()}
    for b, (env, k) in enumerate(order[first:first + B]):
      window = slice(k * T, k * T + T + 1)  # consecutive unrolls share a step
      for name, values in zip(('step_type', 'reward', 'discount'), streams[env]):
        batch[name][b] = values[window]
      batch['env_id'][b] = env
    learner.advantages({k: tf.constant(v) for k, v in batch.items()})
  stats = learner._reward_stats  # pylint: disable=protected-access
  assert stats.count.numpy() == len(expected)
  np.testing.assert_allclose(stats.mean.numpy(), expected.mean(), rtol=1e-5)
  np.testing.assert_allclose(stats.var.numpy(), expected.var(), rtol=1e-5)


def _acted_like(builder, config):
  """A zero batch with the queue's signature."""
  return {k: tf.zeros((config.batch_size,) + tuple(s.shape), s.dtype)
          for k, s in builder.item_signature(SPEC).items()}
