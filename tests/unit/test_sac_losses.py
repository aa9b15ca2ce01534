"""SAC's losses against slow numpy references written literally from the paper.

Each reference loops over the batch entry by entry (and over the n steps of a window,
multiplying its coefficient one step at a time), so a vectorisation bug in the
implementation cannot be mirrored by the reference.
"""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.sac import losses
from seedacme.distributions import NormalHead
from seedacme.types import EnvSpec

GAMMA = 0.9


def _f64(*arrays):
  return [tf.constant(a, tf.float64) for a in arrays]


def reference_critic(q1, q2, rewards, discounts, nq1, nq2, nlp, alpha):
  B = len(q1)
  targets = []
  loss = 0.0
  for b in range(B):
    smaller = nq1[b] if nq1[b] < nq2[b] else nq2[b]
    y = rewards[b] + discounts[b] * (smaller - alpha * nlp[b])
    targets.append(y)
    loss += 0.5 * (q1[b] - y) ** 2 / B + 0.5 * (q2[b] - y) ** 2 / B
  return loss, np.array(targets)


def _critic_inputs(rng, B=16):
  q1, q2, rewards, nq1, nq2 = (rng.normal(0, 1, B) for _ in range(5))
  nlp = rng.normal(-1, 1, B)
  discounts = GAMMA * (rng.random(B) > 0.2)
  discounts[3] = 0.0  # a termination, whatever the draw
  return q1, q2, rewards, discounts, nq1, nq2, nlp


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('alpha', [0.0, 0.2, 1.3])
def test_critic_loss_matches_reference(seed, alpha):
  inputs = _critic_inputs(np.random.default_rng(seed))
  expected_loss, expected_targets = reference_critic(*inputs, alpha)
  loss, metrics = losses.critic_loss(*_f64(*inputs), alpha)
  np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['critic_loss'].numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['target_q'].numpy(), expected_targets.mean(),
                             rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(metrics['q1'].numpy(), inputs[0].mean(), rtol=1e-12)
  np.testing.assert_allclose(metrics['q2'].numpy(), inputs[1].mean(), rtol=1e-12)


def test_critic_target_takes_the_smaller_target_q():
  # Entry 0: Q1' < Q2'; entry 1: Q2' < Q1'. The target uses the smaller one each time.
  q = np.zeros(2)
  rewards, discounts = np.array([1.0, 2.0]), np.array([0.5, 0.5])
  nq1, nq2 = np.array([3.0, 10.0]), np.array([7.0, -4.0])
  nlp = np.array([0.25, -0.5])
  alpha = 0.4
  _, metrics = losses.critic_loss(*_f64(q, q, rewards, discounts, nq1, nq2, nlp), alpha)
  y0 = 1.0 + 0.5 * (3.0 - alpha * 0.25)
  y1 = 2.0 + 0.5 * (-4.0 - alpha * -0.5)
  np.testing.assert_allclose(metrics['target_q'].numpy(), (y0 + y1) / 2, rtol=1e-12)
  # The loss pins each target: with q at y, the loss is 0; with the larger Q it is not.
  loss, _ = losses.critic_loss(*_f64([y0, y1], [y0, y1], rewards, discounts, nq1, nq2, nlp),
                               alpha)
  assert loss.numpy() == pytest.approx(0.0, abs=1e-15)
  loss, _ = losses.critic_loss(*_f64([y0, y1], [y0, y1], rewards, discounts, nq2, nq1, nlp),
                               alpha)
  assert loss.numpy() == pytest.approx(0.0, abs=1e-15)


def test_critic_termination_ignores_the_next_state():
  rewards, discounts = np.array([1.5, 1.5]), np.array([0.0, 0.0])
  nq = np.array([np.inf, np.nan])
  q = np.array([1.0, 2.0])
  loss, metrics = losses.critic_loss(*_f64(q, q, rewards, discounts, nq, nq, nq), 0.3)
  assert metrics['target_q'].numpy() == 1.5
  assert loss.numpy() == pytest.approx(0.5 * 0.25 + 0.5 * 0.25)


def test_critic_gradients_reach_only_the_online_qs():
  inputs = _f64(*_critic_inputs(np.random.default_rng(5)))
  variables = [tf.Variable(x) for x in inputs]
  alpha = tf.Variable(0.3, dtype=tf.float64)
  with tf.GradientTape() as tape:
    loss, _ = losses.critic_loss(*variables, alpha)
  grads = tape.gradient(loss, variables + [alpha])
  q1, q2, rewards, discounts, nq1, nq2, nlp = (x.numpy() for x in inputs)
  _, y = reference_critic(q1, q2, rewards, discounts, nq1, nq2, nlp, 0.3)
  B = len(q1)
  np.testing.assert_allclose(grads[0].numpy(), (q1 - y) / B, rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(grads[1].numpy(), (q2 - y) / B, rtol=1e-12, atol=1e-15)
  assert all(g is None for g in grads[2:])


def test_critic_rejects_a_trailing_unit_dimension():
  with pytest.raises(ValueError, match='shape'):
    losses.critic_loss(*_f64(np.zeros((4, 1)), *[np.zeros(4)] * 6), 0.1)


def reference_actor(q1, q2, log_prob, alpha):
  B = len(q1)
  loss = 0.0
  for b in range(B):
    loss += (alpha * log_prob[b] - min(q1[b], q2[b])) / B
  return loss, -sum(log_prob) / B


@pytest.mark.parametrize('seed', [0, 1])
def test_actor_loss_and_gradients(seed):
  rng = np.random.default_rng(seed)
  B, alpha_value = 12, 0.7
  q1, q2, log_prob = rng.normal(0, 1, B), rng.normal(0, 1, B), rng.normal(-2, 1, B)
  q1[0], q2[0] = -1.0, 1.0  # make sure both sides of the min appear
  q1[1], q2[1] = 1.0, -1.0
  expected_loss, expected_entropy = reference_actor(q1, q2, log_prob, alpha_value)
  variables = [tf.Variable(x) for x in _f64(q1, q2, log_prob)]
  alpha = tf.Variable(alpha_value, dtype=tf.float64)
  with tf.GradientTape() as tape:
    loss, metrics = losses.actor_loss(*variables, alpha)
  g_q1, g_q2, g_lp, g_alpha = tape.gradient(loss, variables + [alpha])
  np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['actor_loss'].numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['entropy'].numpy(), expected_entropy, rtol=1e-12)
  np.testing.assert_allclose(g_lp.numpy(), np.full(B, alpha_value / B), rtol=1e-12)
  np.testing.assert_array_equal(g_q1.numpy(), np.where(q1 < q2, -1.0 / B, 0.0))
  np.testing.assert_array_equal(g_q2.numpy(), np.where(q2 < q1, -1.0 / B, 0.0))
  assert g_alpha is None


def reference_temperature(log_alpha, log_prob, target_entropy):
  B = len(log_prob)
  loss = grad = 0.0
  for b in range(B):
    loss += -log_alpha * (log_prob[b] + target_entropy) / B
    grad += -(log_prob[b] + target_entropy) / B
  return loss, grad


@pytest.mark.parametrize('seed', [0, 1])
def test_temperature_loss_and_gradient(seed):
  rng = np.random.default_rng(seed)
  log_prob, log_alpha_value, target_entropy = rng.normal(0, 2, 10), -0.8, -3.0
  expected_loss, expected_grad = reference_temperature(log_alpha_value, log_prob,
                                                       target_entropy)
  log_alpha = tf.Variable(log_alpha_value, dtype=tf.float64)
  log_prob_t = tf.Variable(log_prob)
  with tf.GradientTape() as tape:
    loss, metrics = losses.temperature_loss(log_alpha, log_prob_t, target_entropy)
  grad, grad_lp = tape.gradient(loss, [log_alpha, log_prob_t])
  np.testing.assert_allclose(loss.numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['temperature_loss'].numpy(), expected_loss, rtol=1e-12)
  np.testing.assert_allclose(metrics['alpha'].numpy(), np.exp(log_alpha_value), rtol=1e-12)
  np.testing.assert_allclose(grad.numpy(), expected_grad, rtol=1e-12)
  assert grad_lp is None


@pytest.mark.parametrize('entropy_below_target', [True, False])
def test_temperature_descent_raises_alpha_when_entropy_is_below_target(
    entropy_below_target):
  target_entropy = -2.0
  # Entropy estimate -mean(log_prob): 1.5 (> -2, above target) or -3.5 (below).
  log_prob = tf.constant([3.0, 4.0] if entropy_below_target else [-1.0, -2.0])
  log_alpha = tf.Variable(0.0)
  alpha_before = tf.exp(log_alpha).numpy()
  with tf.GradientTape() as tape:
    loss, _ = losses.temperature_loss(log_alpha, log_prob, target_entropy)
  tf.keras.optimizers.SGD(0.1).apply_gradients([(tape.gradient(loss, log_alpha),
                                                  log_alpha)])
  _, metrics = losses.temperature_loss(log_alpha, log_prob, target_entropy)
  assert (metrics['alpha'].numpy() > alpha_before) == entropy_below_target


def _variable_pairs(rng, dtype):
  shapes = [(3, 4), (4,), ()]
  targets = [tf.Variable(rng.normal(0, 1, s).astype(dtype)) for s in shapes]
  sources = [tf.Variable(rng.normal(0, 1, s).astype(dtype)) for s in shapes]
  return targets, sources


@pytest.mark.parametrize('dtype', [np.float32, np.float64])
@pytest.mark.parametrize('in_function', [False, True])
def test_polyak_update_exact_values(dtype, in_function):
  targets, sources = _variable_pairs(np.random.default_rng(0), dtype)
  before = [t.numpy() for t in targets]
  update = losses.polyak_update
  if in_function:
    update = tf.function(lambda t, s: losses.polyak_update(t, s, 0.005))
    update(targets, sources)
  else:
    update(targets, sources, 0.005)
  tau = dtype(0.005)
  for target, source, old in zip(targets, sources, before):
    new, src = target.numpy(), source.numpy()
    assert new.dtype == dtype
    # The same arithmetic in the variables' dtype, entry by entry.
    for idx in np.ndindex(old.shape):
      expected = (dtype(1) - tau) * old[idx] + tau * src[idx]
      assert abs(new[idx] - expected) <= 1e-7 * max(1.0, abs(expected))
      if dtype == np.float32:
        assert new[idx] == expected
    np.testing.assert_array_equal(source.numpy(), src)  # the source is untouched


@pytest.mark.parametrize('in_function', [False, True])
def test_polyak_update_tau_one_copies(in_function):
  targets, sources = _variable_pairs(np.random.default_rng(1), np.float32)
  update = tf.function(losses.polyak_update) if in_function else losses.polyak_update
  update(targets, sources, tf.constant(1.0) if in_function else 1.0)
  for target, source in zip(targets, sources):
    np.testing.assert_array_equal(target.numpy(), source.numpy())


def test_polyak_update_checks_its_arguments():
  targets, sources = _variable_pairs(np.random.default_rng(2), np.float32)
  with pytest.raises(ValueError, match='target variables'):
    losses.polyak_update(targets, sources[:-1], 0.1)
  with pytest.raises(ValueError, match='shape'):
    losses.polyak_update(targets, sources[::-1], 0.1)
  with pytest.raises(ValueError, match='tau'):
    losses.polyak_update(targets, sources, 1.5)


def test_unit_log_prob_is_the_density_of_tanh_u():
  # The shared head's log-prob is the env action's density; SAC's is tanh(u)'s in
  # [-1, 1]: log N(u) - sum log(1 - tanh(u)^2). Adding `affine_log_det` gets there.
  low, high = np.array([-0.4, -3.0]), np.array([2.0, 1.0])
  spec = EnvSpec(observation_shape=(4,), observation_dtype='float32', num_actions=0,
                 action_shape=(2,), action_minimum=tuple(low), action_maximum=tuple(high))
  head = NormalHead(spec, squash='tanh')
  assert head.affine_log_det == pytest.approx(np.sum(np.log((high - low) / 2)))
  rng = np.random.default_rng(0)
  mean, log_std = rng.normal(0, 0.5, (6, 2)), rng.uniform(-1, 0.5, (6, 2))
  u = mean + np.exp(log_std) * rng.normal(size=(6, 2))
  mean, log_std, u = (x.astype(np.float32) for x in (mean, log_std, u))
  params = {'mean': tf.constant(mean), 'log_std': tf.constant(log_std)}
  log_p = losses.unit_log_prob(head.log_prob(params, tf.constant(u)), head.affine_log_det)
  for i in range(6):
    expected = 0.0
    for a in range(2):
      m, s, x = (float(v[i, a]) for v in (mean, log_std, u))
      expected += (-0.5 * ((x - m) / np.exp(s)) ** 2 - s - 0.5 * np.log(2 * np.pi)
                   - np.log(1 - np.tanh(x) ** 2))
    assert log_p.numpy()[i] == pytest.approx(expected, abs=1e-4)
