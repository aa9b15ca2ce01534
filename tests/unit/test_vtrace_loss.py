"""V-trace against a slow numpy reference written from the IMPALA paper's equations."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.vtrace import losses


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap, mask,
                     rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0):
  """IMPALA eq. (1), the n-step sum, evaluated literally (no recursion).

      v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
      delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))

  A masked transition t (mask 0) is not a transition: delta_t = 0 and gamma_t = 0.
  """
  T, B = rewards.shape
  vs = np.zeros((T, B))
  adv = np.zeros((T, B))
  for b in range(B):
    v_next = lambda t, b=b: bootstrap[b] if t + 1 == T else values[t + 1, b]
    gamma = [discounts[t, b] * mask[t, b] for t in range(T)]
    rho = [min(rho_bar, np.exp(log_rhos[t, b])) for t in range(T)]
    c = [min(c_bar, np.exp(log_rhos[t, b])) for t in range(T)]
    delta = [mask[t, b] * rho[t] * (rewards[t, b] + gamma[t] * v_next(t) - values[t, b])
             for t in range(T)]
    for s in range(T):
      total = values[s, b]
      for t in range(s, T):
        coef = 1.0
        for i in range(s, t):
          coef *= gamma[i] * c[i]
        total += coef * delta[t]
      vs[s, b] = total
    for s in range(T):
      vs_next = bootstrap[b] if s + 1 == T else vs[s + 1, b]
      pg_rho = min(pg_rho_bar, np.exp(log_rhos[s, b]))
      adv[s, b] = mask[s, b] * pg_rho * (rewards[s, b] + gamma[s] * vs_next - values[s, b])
  return vs, adv


def _random_inputs(rng, T=7, B=4, with_boundaries=True):
  log_rhos = rng.normal(0, 0.8, (T, B))
  discounts = 0.9 * (rng.random((T, B)) > 0.15)  # some terminations
  rewards = rng.normal(0, 1, (T, B))
  values = rng.normal(0, 1, (T, B))
  bootstrap = rng.normal(0, 1, B)
  mask = np.ones((T, B))
  if with_boundaries:
    mask[rng.random((T, B)) < 0.2] = 0.0  # LAST -> FIRST steps inside unrolls
  return log_rhos, discounts, rewards, values, bootstrap, mask


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('clips', [(1.0, 1.0, 1.0), (2.0, 0.5, 1.5)])
def test_vtrace_returns_match_reference(seed, clips):
  rng = np.random.default_rng(seed)
  inputs = _random_inputs(rng)
  rho_bar, c_bar, pg_rho_bar = clips
  expected_vs, expected_adv = reference_vtrace(*inputs, rho_bar=rho_bar, c_bar=c_bar,
                                               pg_rho_bar=pg_rho_bar)
  out = losses.vtrace_returns(*[tf.constant(x, tf.float64) for x in inputs],
                              clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar,
                              clip_c_threshold=c_bar)
  np.testing.assert_allclose(out.vs.numpy(), expected_vs, rtol=1e-10, atol=1e-10)
  np.testing.assert_allclose(out.pg_advantages.numpy(), expected_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_without_discount_cut_is_n_step_return():
  # With pi == mu (log_rho = 0) and no truncation, v_s is the discounted n-step return.
  T, B, gamma = 5, 1, 0.9
  rewards = np.arange(1.0, T + 1.0)[:, None]
  values = np.zeros((T, B))
  bootstrap = np.array([10.0])
  out = losses.vtrace_returns(tf.zeros((T, B), tf.float64), tf.fill((T, B), tf.constant(gamma, tf.float64)),
                              tf.constant(rewards), tf.constant(values), tf.constant(bootstrap))
  expected = [sum(gamma ** (t - s) * rewards[t, 0] for t in range(s, T)) + gamma ** (T - s) * 10.0
              for s in range(T)]
  np.testing.assert_allclose(out.vs.numpy()[:, 0], expected)


def test_masked_transition_cuts_trace_and_keeps_truncation_bootstrap():
  # Episode boundary after step 1: transition 1 is (LAST -> FIRST) and masked.
  # Transition 0 ends in a truncated LAST step (discount 1): its target bootstraps from
  # V(x_1) and must not see anything of the next episode.
  log_rhos = np.zeros((3, 1))
  discounts = np.full((3, 1), 0.5)
  rewards = np.array([[1.0], [100.0], [2.0]])
  values = np.array([[0.0], [4.0], [7.0]])
  bootstrap = np.array([3.0])
  mask = np.array([[1.0], [0.0], [1.0]])
  out = losses.vtrace_returns(*[tf.constant(x, tf.float64) for x in
                                (log_rhos, discounts, rewards, values, bootstrap, mask)])
  vs = out.vs.numpy()[:, 0]
  assert vs[1] == pytest.approx(4.0)  # no target for the masked step: V itself
  assert vs[0] == pytest.approx(1.0 + 0.5 * 4.0)  # bootstraps from V(LAST obs)
  assert vs[2] == pytest.approx(2.0 + 0.5 * 3.0)
  assert out.pg_advantages.numpy()[1, 0] == 0.0


def test_loss_ignores_masked_steps():
  rng = np.random.default_rng(3)
  T, B, A = 6, 3, 4
  log_rhos, discounts, rewards, values, bootstrap, mask = _random_inputs(rng, T, B)
  target = rng.normal(size=(T, B, A))
  behaviour = rng.normal(size=(T, B, A))
  actions = rng.integers(0, A, (T, B))

  def loss_of(target_logits, vals):
    loss, _ = losses.vtrace_loss(tf.constant(target_logits), tf.constant(behaviour),
                                 tf.constant(actions), tf.constant(rewards),
                                 tf.constant(discounts), tf.constant(vals),
                                 tf.constant(bootstrap), tf.constant(mask))
    return float(loss)

  base = loss_of(target, values)
  masked = mask == 0
  assert masked.any()
  perturbed_target = target.copy()
  perturbed_target[masked] += 5.0 * rng.normal(size=(masked.sum(), A))
  perturbed_values = values.copy()
  perturbed_values[masked] += 3.0
  # Changing logits/values at masked steps changes nothing (values at a masked step
  # are only used as that step's own baseline, which is masked).
  assert loss_of(perturbed_target, values) == pytest.approx(base, rel=1e-12)
  unmasked = np.argwhere(~masked)[0]
  moved = target.copy()
  moved[tuple(unmasked) + (0,)] += 1.0  # one action: softmax changes
  assert loss_of(moved, values) != pytest.approx(base, rel=1e-6)


def test_loss_gradient_pushes_towards_advantageous_action():
  # One step, on-policy, positive advantage for action 1: gradient descent raises its logit.
  logits = tf.Variable([[[0.0, 0.0]]], dtype=tf.float64)
  with tf.GradientTape() as tape:
    loss, _ = losses.vtrace_loss(logits, tf.constant([[[0.0, 0.0]]], tf.float64),
                                 tf.constant([[1]]), tf.constant([[1.0]], tf.float64),
                                 tf.constant([[0.0]], tf.float64), tf.constant([[0.0]], tf.float64),
                                 tf.constant([0.0], tf.float64), entropy_cost=0.0)
  grad = tape.gradient(loss, logits).numpy()[0, 0]
  assert grad[1] < 0 < grad[0]
