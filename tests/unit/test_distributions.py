"""Action heads: exact log-probs, actions inside bounds, and all of it under XLA."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from seedacme.distributions import (ActionHead, CategoricalHead, NormalHead,
                                    make_action_head)
from seedacme.types import EnvSpec


def _spec(low, high, shape=None):
  shape = shape or (len(low),)
  return EnvSpec(observation_shape=(4,), observation_dtype='float32', num_actions=0,
                 action_shape=shape, action_minimum=tuple(low), action_maximum=tuple(high))


def _params(mean, log_std):
  mean = np.asarray(mean, np.float32)
  return {'mean': tf.constant(mean),
          'log_std': tf.constant(np.broadcast_to(log_std, mean.shape), tf.float32)}


ONE_D = ([-0.4], [2.0])
THREE_D = ([-0.4, -1.0, 0.1], [2.0, 1.0, 0.3])


@pytest.mark.parametrize('bounds', [ONE_D, THREE_D])
def test_tanh_log_prob_is_the_env_actions_density(bounds):
  low, high = (np.asarray(b, np.float64) for b in bounds)
  head = NormalHead(_spec(low, high), squash='tanh')
  rng = np.random.default_rng(0)
  n, a = 50, len(low)
  mean, log_std = rng.normal(0, 0.7, (n, a)), rng.uniform(-1.0, 0.5, (n, a))
  u = (mean + np.exp(log_std) * rng.normal(size=(n, a))).astype(np.float32)
  log_p = head.log_prob(_params(mean, log_std), tf.constant(u)).numpy()
  # Change of variables: p(action) = N(u) * |du/da|, du/da by finite differences of
  # the inverse map (atanh of the action rescaled to [-1, 1]).
  u64 = u.astype(np.float64)
  action = low + (np.tanh(u64) + 1.0) / 2.0 * (high - low)
  inverse = lambda x: np.arctanh(2.0 * (x - low) / (high - low) - 1.0)
  h = 1e-6 * (high - low)
  du_da = (inverse(action + h) - inverse(action - h)) / (2.0 * h)
  std = np.exp(log_std.astype(np.float32).astype(np.float64))
  density = np.prod(stats.norm.pdf(u64, mean.astype(np.float32), std) * np.abs(du_da), -1)
  np.testing.assert_allclose(np.exp(log_p), density, rtol=2e-4)
  # ... and `to_env` is that action.
  np.testing.assert_allclose(head.to_env(tf.constant(u)).numpy(), action, rtol=1e-5,
                             atol=1e-6)


def test_tanh_density_integrates_to_one_over_the_bounds():
  low, high = -0.4, 2.0
  head = NormalHead(_spec([low], [high]), squash='tanh')
  action = np.linspace(low, high, 1_000_001)[1:-1]
  u = np.arctanh(2.0 * (action - low) / (high - low) - 1.0)
  params = _params(np.full((len(u), 1), 0.3), -0.3)
  density = np.exp(head.log_prob(params, tf.constant(u[:, None], tf.float32)).numpy())
  assert abs(np.trapz(density, action) - 1.0) < 1e-3


@pytest.mark.parametrize('squash', ['tanh', 'clip'])
def test_actions_are_always_inside_the_bounds(squash):
  spec = _spec([-0.4, -1.0, 0.1, -3.3], [2.0, 1.0, 0.3, 1e-3], shape=(2, 2))
  head = make_action_head(spec, squash=squash, init_log_std=5.0)
  n = 100_000
  features = tf.random.normal([n, 6], seed=1)
  params = head(features)
  assert params['log_std'].numpy().max() == 2.0  # clipped to the sane range
  signs = np.random.default_rng(1).choice([-1.0, 1.0], size=(n, 4))
  params['mean'] = tf.constant(50.0 * signs, tf.float32)
  raw = head.sample(params, tf.random.Generator.from_seed(3))
  action = head.to_env(raw).numpy()
  assert action.shape == (n, 2, 2) and action.dtype == np.float32
  assert np.isfinite(action).all()
  low = np.reshape(spec.action_minimum, (2, 2))
  high = np.reshape(spec.action_maximum, (2, 2))
  assert (action >= low).all() and (action <= high).all()
  assert (action == action.max(0)).any() and (action == action.min(0)).any()
  spec.check_actions(action)  # what the server checks before actions go to envs


def test_categorical_log_prob_sampling_mode_and_entropy():
  head = CategoricalHead(5, init_scale=0.01)
  assert head(tf.ones([3, 7]))['logits'].shape == (3, 5)
  logits = np.array([[0.5, -1.0, 2.0, 0.0, 1.0]], np.float32)
  params = {'logits': tf.constant(logits)}
  probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
  for index in range(5):
    log_p = head.log_prob(params, tf.constant([index], tf.int32)).numpy()
    np.testing.assert_allclose(log_p, [np.log(probs[index])], rtol=1e-5)
  n = 200_000
  many = {'logits': tf.constant(np.repeat(logits, n, axis=0))}
  raw = head.sample(many, tf.random.Generator.from_seed(0))
  assert raw.dtype == tf.int32 and head.to_env(raw).dtype == tf.int32
  counts = np.bincount(raw.numpy(), minlength=5)
  chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum()
  assert chi2 < stats.chi2.ppf(0.999, df=4), (counts / n, probs)
  assert head.mode(params).numpy().tolist() == [2]
  np.testing.assert_allclose(head.entropy(params).numpy(), [stats.entropy(probs)], rtol=1e-5)


@pytest.mark.parametrize('squash', ['tanh', 'clip'])
def test_normal_mode_is_the_squashed_mean(squash):
  low, high = np.array([-0.4, -1.0, 0.0]), np.array([2.0, 1.0, 5.0])
  head = NormalHead(_spec(low, high), squash=squash)
  mean = np.array([[0.3, -2.0, 0.9], [5.0, 0.0, -0.5]])
  action = head.to_env(head.mode(_params(mean, 0.0))).numpy()
  y = np.tanh(mean) if squash == 'tanh' else np.clip(mean, -1.0, 1.0)
  np.testing.assert_allclose(action, low + (y + 1.0) / 2.0 * (high - low), rtol=1e-5,
                             atol=1e-6)


def test_clip_entropy_is_the_normals_and_tanh_entropy_bounds_the_true_one():
  bounds = ([-1.0, -2.0], [1.0, 2.0])
  log_std = np.array([[-0.5, 0.3], [0.1, -1.2]])
  mean = np.array([[0.2, -0.7], [1.5, 0.0]])
  clip_head = NormalHead(_spec(*bounds), squash='clip')
  expected = stats.norm.entropy(0.0, np.exp(log_std)).sum(-1)
  np.testing.assert_allclose(clip_head.entropy(_params(mean, log_std)).numpy(), expected,
                             rtol=1e-5)
  # The tanh head's estimate at the mode is an upper bound on the true entropy
  # (Jensen), and close to it when the std is small. True entropy of the bijection:
  # H(action) = H(u) + E[log |d action / d u|], the expectation by Monte Carlo.
  tanh_head = NormalHead(_spec(*bounds), squash='tanh')
  n = 100_000
  for scale, gap in ((1.0, None), (0.01, 1e-3)):
    scaled = log_std + np.log(scale)
    params = _params(np.repeat(mean, n, 0), np.repeat(scaled, n, 0))
    u = tanh_head.sample(params, tf.random.Generator.from_seed(0)).numpy().astype(np.float64)
    log_det = np.log(1.0 - np.tanh(u) ** 2).sum(-1) + np.log([1.0, 2.0]).sum()
    true = stats.norm.entropy(0.0, np.exp(scaled)).sum(-1) + log_det.reshape(2, n).mean(-1)
    estimate = tanh_head.entropy(params).numpy().reshape(2, n)[:, 0]
    assert (estimate >= true - 1e-3).all(), (estimate, true)
    if gap is not None:
      np.testing.assert_allclose(estimate, true, atol=gap)


def test_heads_run_under_xla_and_in_time_major_batches():
  rng = tf.random.Generator.from_seed(7)
  heads = [CategoricalHead(4), NormalHead(_spec(*THREE_D), 'tanh'),
           NormalHead(_spec(*THREE_D), 'clip')]
  features = tf.random.normal([8, 5], seed=2)

  @tf.function(jit_compile=True)
  def act(head, x):
    params = head(x)
    raw = head.sample(params, rng)
    return raw, head.log_prob(params, raw), head.to_env(raw), head.entropy(params), \
        head.to_env(head.mode(params))

  for head in heads:
    head(features)  # builds the variables (servers build networks before compiling)
    raw, log_p, action, entropy, greedy = act(head, features)
    assert raw.shape == [8, *head.raw_spec.shape] and raw.dtype == head.raw_spec.dtype
    assert action.shape == [8, *head.action_spec.shape]
    assert greedy.shape == action.shape and entropy.shape == log_p.shape == [8]
    np.testing.assert_allclose(log_p.numpy(), head.log_prob(head(features), raw).numpy(),
                               rtol=1e-5, atol=1e-5)
    # The learner's [T, B, F] features give [T, B] log-probs.
    params = head(tf.reshape(features, [2, 4, 5]))
    time_major = head.log_prob(params, tf.reshape(raw, [2, 4, *raw.shape[1:]]))
    np.testing.assert_allclose(time_major.numpy().ravel(), log_p.numpy(), rtol=1e-5,
                               atol=1e-5)


def test_normal_log_std_is_a_trainable_state_independent_vector():
  head = NormalHead(_spec(*THREE_D), init_log_std=-0.5)
  features = tf.random.normal([6, 5], seed=4)
  with tf.GradientTape() as tape:
    params = head(features)
    loss = -tf.reduce_mean(head.log_prob(params, tf.ones([6, 3])))
  assert set(v.name for v in head.trainable_variables) >= {'normal_head/log_std:0'}
  grads = tape.gradient(loss, head.trainable_variables)
  assert all(g is not None for g in grads)
  np.testing.assert_allclose(params['log_std'].numpy(), np.full((6, 3), -0.5))


def test_make_action_head_picks_the_head_and_names_a_spec_it_cannot_serve():
  discrete = EnvSpec(observation_shape=(4,), observation_dtype='float32', num_actions=3)
  head = make_action_head(discrete, init_scale=0.01)
  assert isinstance(head, CategoricalHead) and isinstance(head, ActionHead)
  assert head.raw_spec == tf.TensorSpec([], tf.int32)
  continuous = _spec(*THREE_D)
  head = make_action_head(continuous, squash='clip')
  assert isinstance(head, NormalHead) and head.squash == 'clip'
  assert head.raw_spec == tf.TensorSpec([3], tf.float32)
  with pytest.raises(ValueError, match='squash'):
    make_action_head(continuous, squash='softsign')
  with pytest.raises(ValueError, match='no action head for'):
    make_action_head(object())
  with pytest.raises(ValueError, match='3 discrete actions'):
    make_action_head(discrete, init_log_std=0.0)
