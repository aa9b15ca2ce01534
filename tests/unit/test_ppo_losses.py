"""PPO's losses against slow numpy references written literally from the papers.

GAE and V-trace(lambda) are checked as explicit n-step sums (no recursion), so a bug in
the implementation's backward scan cannot be mirrored by the reference.
"""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.ppo import losses
from seedacme.agents.vtrace import losses as vtrace_losses

GAMMA = 0.9


def reference_gae(rewards, discounts, values, bootstrap, mask, lam):
  """A_s = sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i lambda) delta_t, literally.

  A masked transition t is no transition: delta_t = 0 and gamma_t = 0.
  """
  T, B = rewards.shape
  adv = np.zeros((T, B))
  for b in range(B):
    gamma = [discounts[t, b] * mask[t, b] for t in range(T)]
    delta = []
    for t in range(T):
      v_next = bootstrap[b] if t + 1 == T else values[t + 1, b]
      delta.append(mask[t, b] * (rewards[t, b] + gamma[t] * v_next - values[t, b]))
    for s in range(T):
      total = 0.0
      for t in range(s, T):
        coef = 1.0
        for i in range(s, t):
          coef *= gamma[i] * lam
        total += coef * delta[t]
      adv[s, b] = total
  return adv, adv + values


def reference_bootstrapped_return(rewards, discounts, values, bootstrap, mask, s, b):
  """Monte-Carlo return from x_s to its episode's LAST step or the unroll's end,
  plus the discounted value of the observation it stops at."""
  T = rewards.shape[0]
  total, coef = 0.0, 1.0
  for t in range(s, T):
    if mask[t, b] == 0:  # x_t is LAST: bootstrap from it (coef is 0 after a termination)
      return total + coef * values[t, b]
    total += coef * rewards[t, b]
    coef *= discounts[t, b]
  return total + coef * bootstrap[b]


def reference_vtrace(target_lp, behaviour_lp, rewards, discounts, values, bootstrap, mask,
                     lam=1.0, rho_bar=1.0, c_bar=1.0):
  """IMPALA eq. (1) with c_i = lambda min(c_bar, rho_i), as an explicit n-step sum."""
  T, B = rewards.shape
  vs = np.zeros((T, B))
  adv = np.zeros((T, B))
  for b in range(B):
    gamma = [discounts[t, b] * mask[t, b] for t in range(T)]
    ratio = [np.exp(target_lp[t, b] - behaviour_lp[t, b]) for t in range(T)]
    rho = [min(rho_bar, ratio[t]) for t in range(T)]
    c = [lam * min(c_bar, ratio[t]) for t in range(T)]
    delta = []
    for t in range(T):
      v_next = bootstrap[b] if t + 1 == T else values[t + 1, b]
      delta.append(mask[t, b] * rho[t] * (rewards[t, b] + gamma[t] * v_next - values[t, b]))
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
      adv[s, b] = mask[s, b] * rho[s] * (rewards[s, b] + gamma[s] * vs_next - values[s, b])
  return adv, vs


def reference_ppo(log_probs, behaviour_log_probs, advantages, values, behaviour_values,
                  returns, entropy, mask, eps, value_clip, baseline_cost, entropy_cost):
  """PPO's loss and metrics entry by entry, averaged over the unmasked entries."""
  n = 0
  policy = value = ent = clipped = kl = ratio_sum = 0.0
  for idx in np.ndindex(mask.shape):
    if mask[idx] == 0:
      continue
    n += 1
    ratio = np.exp(log_probs[idx] - behaviour_log_probs[idx])
    a = advantages[idx]
    policy += -min(ratio * a, min(max(ratio, 1 - eps), 1 + eps) * a)
    err = (values[idx] - returns[idx]) ** 2
    if value_clip is not None:
      v_clipped = behaviour_values[idx] + min(max(values[idx] - behaviour_values[idx],
                                                  -value_clip), value_clip)
      err = max(err, (v_clipped - returns[idx]) ** 2)
    value += 0.5 * err
    ent += entropy[idx]
    clipped += float(abs(ratio - 1) > eps)
    kl += (ratio - 1) - np.log(ratio)
    ratio_sum += ratio
  policy, value, ent = policy / n, value / n, ent / n
  loss = policy + baseline_cost * value - entropy_cost * ent
  return loss, {'policy_loss': policy, 'value_loss': value, 'entropy': ent,
                'clip_fraction': clipped / n, 'approx_kl': kl / n, 'mean_ratio': ratio_sum / n}


def _unroll_with_episode_ends(rng, T=8, B=3, truncated=True):
  """Random unrolls; in column 0, x_3 is a LAST step (transition 3 masked).

  Terminated: discounts[2] = 0. Truncated: discounts[2] = gamma (env discount 1).
  Other columns get random terminations and boundaries.
  """
  rewards = rng.normal(0, 1, (T, B))
  values = rng.normal(0, 1, (T, B))
  bootstrap = rng.normal(0, 1, B)
  discounts = GAMMA * (rng.random((T, B)) > 0.15)
  mask = np.ones((T, B))
  mask[rng.random((T, B)) < 0.2] = 0.0
  discounts[:, 0] = GAMMA
  mask[:, 0] = 1.0
  discounts[2, 0] = GAMMA if truncated else 0.0
  mask[3, 0] = 0.0
  return rewards, discounts, values, bootstrap, mask


def _gae(rewards, discounts, values, bootstrap, mask, lam):
  out = losses.gae(*[tf.constant(x, tf.float64) for x in
                     (rewards, discounts, values, bootstrap, mask)], lambda_=lam)
  return out.advantages.numpy(), out.returns.numpy()


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('truncated', [True, False])
@pytest.mark.parametrize('lam', [0.0, 0.7, 0.95, 1.0])
def test_gae_matches_reference(seed, truncated, lam):
  inputs = _unroll_with_episode_ends(np.random.default_rng(seed), truncated=truncated)
  expected_adv, expected_ret = reference_gae(*inputs, lam)
  adv, ret = _gae(*inputs, lam)
  np.testing.assert_allclose(adv, expected_adv, atol=1e-5)
  np.testing.assert_allclose(ret, expected_ret, atol=1e-5)
  mask = inputs[-1]
  assert np.all(adv[mask == 0] == 0.0)


def test_gae_lambda_zero_is_one_step_td():
  rewards, discounts, values, bootstrap, mask = _unroll_with_episode_ends(
      np.random.default_rng(4))
  adv, _ = _gae(rewards, discounts, values, bootstrap, mask, 0.0)
  T, B = rewards.shape
  for t in range(T):
    for b in range(B):
      v_next = bootstrap[b] if t + 1 == T else values[t + 1, b]
      td = rewards[t, b] + discounts[t, b] * v_next - values[t, b]
      assert adv[t, b] == pytest.approx(mask[t, b] * td, abs=1e-5)


@pytest.mark.parametrize('truncated', [True, False])
def test_gae_lambda_one_is_monte_carlo_with_bootstrap(truncated):
  inputs = _unroll_with_episode_ends(np.random.default_rng(5), truncated=truncated)
  _, ret = _gae(*inputs, 1.0)
  mask = inputs[-1]
  T, B = mask.shape
  for t in range(T):
    for b in range(B):
      if mask[t, b]:
        expected = reference_bootstrapped_return(*inputs, t, b)
        assert ret[t, b] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize('lam', [0.0, 0.95, 1.0])
def test_gae_bootstraps_truncation_but_not_termination(lam):
  # Column 0: x_3 is LAST. Transition 2 (x_2 -> x_3) bootstraps gamma V(x_3) only when
  # the episode was truncated; nothing of the next episode (t >= 4) leaks into t <= 3.
  for truncated in (True, False):
    rewards, discounts, values, bootstrap, mask = _unroll_with_episode_ends(
        np.random.default_rng(6), truncated=truncated)
    adv, _ = _gae(rewards, discounts, values, bootstrap, mask, lam)
    moved = values.copy()
    moved[3, 0] += 1.0
    adv_moved, _ = _gae(rewards, discounts, moved, bootstrap, mask, lam)
    change = adv_moved[2, 0] - adv[2, 0]
    assert change == pytest.approx(GAMMA if truncated else 0.0, abs=1e-9)
    next_episode = rewards.copy()
    next_episode[4:, 0] += 10.0
    bootstrap_moved = bootstrap.copy()
    bootstrap_moved[0] += 10.0
    adv_next, _ = _gae(next_episode, discounts, values, bootstrap_moved, mask, lam)
    np.testing.assert_array_equal(adv_next[:4, 0], adv[:4, 0])


def test_gae_in_tf_function_float32():
  inputs = _unroll_with_episode_ends(np.random.default_rng(7))
  fn = tf.function(lambda *x: losses.gae(*x, lambda_=0.95))
  out = fn(*[tf.constant(x, tf.float32) for x in inputs])
  expected_adv, expected_ret = reference_gae(*inputs, 0.95)
  np.testing.assert_allclose(out.advantages.numpy(), expected_adv, atol=1e-5)
  np.testing.assert_allclose(out.returns.numpy(), expected_ret, atol=1e-5)


def test_normalize_advantages():
  rng = np.random.default_rng(8)
  adv = rng.normal(3.0, 5.0, (9, 4))
  mask = (rng.random((9, 4)) > 0.3).astype(np.float64)
  adv[mask == 0] = 1e3  # garbage at masked entries must not move the statistics
  out = losses.normalize_advantages(tf.constant(adv), tf.constant(mask)).numpy()
  unmasked = out[mask == 1]
  assert unmasked.mean() == pytest.approx(0.0, abs=1e-6)
  assert unmasked.std() == pytest.approx(1.0, abs=1e-6)
  assert np.all(out[mask == 0] == 0.0)
  ref = adv[mask == 1]
  np.testing.assert_allclose(unmasked, (ref - ref.mean()) / (ref.std() + 1e-8), rtol=1e-12)


def _vtrace(target_lp, behaviour_lp, rewards, discounts, values, bootstrap, mask, **kwargs):
  out = losses.vtrace_advantages(*[tf.constant(x, tf.float64) for x in (
      target_lp, behaviour_lp, rewards, discounts, values, bootstrap, mask)], **kwargs)
  return out.advantages.numpy(), out.returns.numpy()


@pytest.mark.parametrize('truncated', [True, False])
def test_vtrace_on_policy_lambda_one_equals_gae(truncated):
  rewards, discounts, values, bootstrap, mask = _unroll_with_episode_ends(
      np.random.default_rng(9), truncated=truncated)
  log_probs = np.random.default_rng(10).normal(-1.0, 0.5, rewards.shape)
  adv, ret = _vtrace(log_probs, log_probs, rewards, discounts, values, bootstrap, mask,
                     lambda_=1.0)
  gae_adv, gae_ret = _gae(rewards, discounts, values, bootstrap, mask, 1.0)
  np.testing.assert_allclose(adv, gae_adv, atol=1e-10)
  np.testing.assert_allclose(ret, gae_ret, atol=1e-10)


def test_vtrace_on_policy_returns_equal_gae_returns_for_any_lambda():
  inputs = _unroll_with_episode_ends(np.random.default_rng(11))
  zeros = np.zeros(inputs[0].shape)
  _, ret = _vtrace(zeros, zeros, *inputs, lambda_=0.8)
  _, gae_ret = _gae(*inputs, 0.8)
  np.testing.assert_allclose(ret, gae_ret, atol=1e-10)


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('lam,rho_bar,c_bar', [(1.0, 1.0, 1.0), (0.9, 2.0, 0.5),
                                               (0.5, 1.0, 1.5)])
def test_vtrace_off_policy_matches_reference(seed, lam, rho_bar, c_bar):
  rng = np.random.default_rng(seed)
  inputs = _unroll_with_episode_ends(rng)
  target_lp = rng.normal(-1.0, 0.6, inputs[0].shape)
  behaviour_lp = rng.normal(-1.0, 0.6, inputs[0].shape)
  expected_adv, expected_vs = reference_vtrace(target_lp, behaviour_lp, *inputs, lam=lam,
                                               rho_bar=rho_bar, c_bar=c_bar)
  adv, vs = _vtrace(target_lp, behaviour_lp, *inputs, lambda_=lam,
                    clip_rho_threshold=rho_bar, clip_c_threshold=c_bar)
  np.testing.assert_allclose(adv, expected_adv, atol=1e-10)
  np.testing.assert_allclose(vs, expected_vs, atol=1e-10)


def test_vtrace_lambda_one_agrees_with_vtrace_agent():
  rng = np.random.default_rng(12)
  rewards, discounts, values, bootstrap, mask = _unroll_with_episode_ends(rng)
  target_lp = rng.normal(-1.0, 0.6, rewards.shape)
  behaviour_lp = rng.normal(-1.0, 0.6, rewards.shape)
  adv, vs = _vtrace(target_lp, behaviour_lp, rewards, discounts, values, bootstrap, mask)
  ref = vtrace_losses.vtrace_returns(*[tf.constant(x, tf.float64) for x in (
      target_lp - behaviour_lp, discounts, rewards, values, bootstrap, mask)])
  np.testing.assert_allclose(vs, ref.vs.numpy(), atol=1e-12)
  np.testing.assert_allclose(adv, ref.pg_advantages.numpy(), atol=1e-12)


def _ppo_inputs(rng, shape=(6, 5)):
  return dict(
      log_probs=rng.normal(-1.0, 0.3, shape),
      behaviour_log_probs=rng.normal(-1.0, 0.3, shape),
      advantages=rng.normal(0, 1, shape),
      values=rng.normal(0, 1, shape),
      behaviour_values=rng.normal(0, 1, shape),
      returns=rng.normal(0, 1, shape),
      entropy=rng.random(shape),
      mask=(rng.random(shape) > 0.25).astype(np.float64))


def _ppo(inputs, **kwargs):
  """(loss, metrics, gradients w.r.t. every input) in float64."""
  tensors = {k: tf.constant(v, tf.float64) for k, v in inputs.items()}
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(list(tensors.values()))
    loss, metrics = losses.ppo_loss(**tensors, **kwargs)
  grads = {k: tape.gradient(loss, t) for k, t in tensors.items()}
  grads = {k: None if g is None else g.numpy() for k, g in grads.items()}
  return float(loss), {k: float(v) for k, v in metrics.items()}, grads


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('value_clip', [None, 0.2])
@pytest.mark.parametrize('costs', [(0.5, 0.0), (1.0, 0.01)])
def test_ppo_loss_matches_reference(seed, value_clip, costs):
  inputs = _ppo_inputs(np.random.default_rng(seed))
  baseline_cost, entropy_cost = costs
  loss, metrics, grads = _ppo(inputs, clip_epsilon=0.1, value_clip=value_clip,
                              baseline_cost=baseline_cost, entropy_cost=entropy_cost)
  ref_loss, ref_metrics = reference_ppo(*inputs.values(), 0.1, value_clip, baseline_cost,
                                        entropy_cost)
  assert loss == pytest.approx(ref_loss, rel=1e-10)
  for name, value in ref_metrics.items():
    assert metrics[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
  assert 0.0 < metrics['clip_fraction'] < 1.0  # both branches exercised
  # Targets are not trained through.
  assert grads['advantages'] is None and grads['returns'] is None


def test_value_clipping_keeps_the_larger_error():
  # PPO2: max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), V_old = 0, c = 0.2.
  inputs = dict(log_probs=np.zeros(3), behaviour_log_probs=np.zeros(3),
                advantages=np.zeros(3), values=np.array([1.0, 0.1, -1.0]),
                behaviour_values=np.zeros(3), returns=np.array([0.5, 1.0, 0.4]),
                entropy=np.zeros(3), mask=np.ones(3))
  _, metrics, grads = _ppo(inputs, value_clip=0.2, baseline_cost=1.0)
  # 0: V overshoots R, max(0.25, (0.2 - 0.5)^2 = 0.09): unclipped, gradient flows.
  # 1: V inside the clip range, both terms equal 0.81.
  # 2: V moved away from R beyond the clip, max(1.96, (-0.2 - 0.4)^2 = 0.36) = 1.96.
  assert metrics['value_loss'] == pytest.approx(0.5 * (0.25 + 0.81 + 1.96) / 3)
  np.testing.assert_allclose(grads['values'], np.array([0.5, -0.9, -1.4]) / 3)
  # V moved towards R past the clip: (0.5 - 0.4)^2 = 0.01 < (0.2 - 0.4)^2 = 0.04. The
  # clipped term wins and is constant in V: the update is bounded, zero gradient.
  inputs.update(values=np.full(3, 0.5), returns=np.full(3, 0.4))
  _, metrics, grads = _ppo(inputs, value_clip=0.2, baseline_cost=1.0)
  assert metrics['value_loss'] == pytest.approx(0.5 * 0.04)
  np.testing.assert_array_equal(grads['values'], np.zeros(3))
  # Without value_clip the same entries give 0.5 (V - R)^2 and a gradient.
  _, metrics, grads = _ppo(inputs, baseline_cost=1.0)
  assert metrics['value_loss'] == pytest.approx(0.5 * 0.01)
  np.testing.assert_allclose(grads['values'], np.full(3, 0.1 / 3))


@pytest.mark.parametrize('log_ratio,advantage,clipped', [
    (np.log(1.5), 1.0, True),    # A > 0, ratio > 1 + eps: no more gain from raising pi
    (np.log(0.5), -1.0, True),   # A < 0, ratio < 1 - eps: no more gain from lowering pi
    (np.log(0.5), 1.0, False),   # A > 0, ratio < 1 - eps: pessimistic side, unclipped
    (np.log(1.5), -1.0, False),  # A < 0, ratio > 1 + eps: pessimistic side, unclipped
    (np.log(1.1), 1.0, False),   # inside the trust region
    (np.log(0.9), -1.0, False),
])
def test_surrogate_clips_on_both_sides(log_ratio, advantage, clipped):
  inputs = dict(log_probs=np.array([log_ratio - 1.0]), behaviour_log_probs=np.array([-1.0]),
                advantages=np.array([advantage]), values=np.zeros(1),
                behaviour_values=np.zeros(1), returns=np.zeros(1), entropy=np.zeros(1),
                mask=np.ones(1))
  loss, metrics, grads = _ppo(inputs, clip_epsilon=0.2)
  ratio = np.exp(log_ratio)
  expected = -min(ratio * advantage, np.clip(ratio, 0.8, 1.2) * advantage)
  assert loss == pytest.approx(expected)
  # d(-ratio A)/d log_probs = -ratio A where unclipped; zero where clipped.
  assert grads['log_probs'][0] == pytest.approx(0.0 if clipped else -ratio * advantage)
  assert metrics['clip_fraction'] == float(abs(ratio - 1) > 0.2)


def test_masked_entries_change_nothing():
  rng = np.random.default_rng(13)
  inputs = _ppo_inputs(rng)
  masked = inputs['mask'] == 0
  assert masked.any() and (~masked).any()
  kwargs = dict(clip_epsilon=0.2, value_clip=0.3, baseline_cost=0.5, entropy_cost=0.01)
  loss, metrics, grads = _ppo(inputs, **kwargs)
  perturbed = {k: v.copy() for k, v in inputs.items()}
  for name in perturbed:
    if name != 'mask':
      perturbed[name][masked] += rng.normal(0, 5.0, masked.sum())
  perturbed['log_probs'][masked] = 80.0  # exp would overflow if not zeroed first
  perturbed['values'][masked] = np.inf
  perturbed['entropy'][masked] = np.nan
  p_loss, p_metrics, p_grads = _ppo(perturbed, **kwargs)
  assert p_loss == loss
  assert p_metrics == metrics
  for name in ('log_probs', 'values', 'entropy'):
    np.testing.assert_array_equal(p_grads[name], grads[name])
    assert np.all(grads[name][masked] == 0.0)


def reference_decoupled(log_probs, proximal_log_probs, behaviour_log_probs, advantages,
                        values, proximal_values, returns, entropy, mask, eps, value_clip,
                        baseline_cost, entropy_cost, c_bar, correct_behaviour=True):
  """Hilton et al. (2021), eq. for L^CLIP decoupled, entry by entry:
  -(pi_prox/mu truncated at c_bar) min(r A, clip(r) A), r = pi/pi_prox."""
  n = 0
  policy = value = ent = clipped = kl = ratio_sum = 0.0
  weight_sum = truncated = behaviour_kl = 0.0
  for idx in np.ndindex(mask.shape):
    if mask[idx] == 0:
      continue
    n += 1
    rho = np.exp(proximal_log_probs[idx] - behaviour_log_probs[idx])
    w = min(c_bar, rho)
    weight_sum += w
    truncated += float(rho > c_bar)
    behaviour_kl += (rho - 1) - np.log(rho)
    r = np.exp(log_probs[idx] - proximal_log_probs[idx])
    a = advantages[idx]
    policy += -(w if correct_behaviour else 1.0) * min(r * a, np.clip(r, 1 - eps, 1 + eps) * a)
    err = (values[idx] - returns[idx]) ** 2
    if value_clip is not None:
      v_clipped = proximal_values[idx] + np.clip(values[idx] - proximal_values[idx],
                                                 -value_clip, value_clip)
      err = max(err, (v_clipped - returns[idx]) ** 2)
    value += 0.5 * err
    ent += entropy[idx]
    clipped += float(abs(r - 1) > eps)
    kl += (r - 1) - np.log(r)
    ratio_sum += r
  policy, value, ent = policy / n, value / n, ent / n
  loss = policy + baseline_cost * value - entropy_cost * ent
  return loss, {'policy_loss': policy, 'value_loss': value, 'entropy': ent,
                'clip_fraction': clipped / n, 'approx_kl': kl / n, 'mean_ratio': ratio_sum / n,
                'behaviour_weight': weight_sum / n, 'behaviour_weight_clipped': truncated / n,
                'behaviour_kl': behaviour_kl / n}


def _decoupled_inputs(rng, shape=(6, 5)):
  inputs = _ppo_inputs(rng, shape)
  behaviour = inputs.pop('behaviour_log_probs')
  return dict(log_probs=inputs['log_probs'],
              proximal_log_probs=rng.normal(-1.0, 0.3, shape),
              behaviour_log_probs=behaviour, advantages=inputs['advantages'],
              values=inputs['values'], proximal_values=inputs.pop('behaviour_values'),
              returns=inputs['returns'], entropy=inputs['entropy'], mask=inputs['mask'])


def _decoupled(inputs, **kwargs):
  tensors = {k: tf.constant(v, tf.float64) for k, v in inputs.items()}
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(list(tensors.values()))
    loss, metrics = losses.decoupled_ppo_loss(**tensors, **kwargs)
  grads = {k: tape.gradient(loss, t) for k, t in tensors.items()}
  grads = {k: None if g is None else g.numpy() for k, g in grads.items()}
  return float(loss), {k: float(v) for k, v in metrics.items()}, grads


@pytest.mark.parametrize('seed', [0, 1])
@pytest.mark.parametrize('c_bar', [0.8, 1.0, 100.0])
@pytest.mark.parametrize('value_clip', [None, 0.2])
@pytest.mark.parametrize('correct_behaviour', [True, False])
def test_decoupled_loss_matches_reference(seed, c_bar, value_clip, correct_behaviour):
  inputs = _decoupled_inputs(np.random.default_rng(seed))
  kwargs = dict(clip_epsilon=0.1, value_clip=value_clip, baseline_cost=0.5,
                entropy_cost=0.01)
  loss, metrics, grads = _decoupled(inputs, behaviour_weight_clip=c_bar,
                                    correct_behaviour=correct_behaviour, **kwargs)
  ref_loss, ref_metrics = reference_decoupled(*inputs.values(), 0.1, value_clip, 0.5, 0.01,
                                              c_bar, correct_behaviour)
  assert loss == pytest.approx(ref_loss, rel=1e-10)
  assert set(metrics) == set(ref_metrics) | {'loss'}
  for name, value in ref_metrics.items():
    assert metrics[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
  assert 0.0 < metrics['clip_fraction'] < 1.0
  if c_bar == 1.0:
    assert 0.0 < metrics['behaviour_weight_clipped'] < 1.0  # both sides of c_bar
  # Neither the proximal nor the behaviour policy is trained through (nor the targets).
  for name in ('proximal_log_probs', 'behaviour_log_probs', 'advantages', 'returns'):
    assert grads[name] is None or not np.any(grads[name]), name


def test_decoupled_gradient_is_the_weighted_ratio_against_the_proximal_policy():
  # One entry inside the trust region: d loss / d log_pi = -w r A, r = pi / pi_prox.
  for log_prox, log_mu, c_bar in ((-1.0, -1.5, 1.0), (-1.0, -0.5, 1.0), (-1.0, -1.5, 2.0)):
    inputs = dict(log_probs=np.array([-0.95]), proximal_log_probs=np.array([log_prox]),
                  behaviour_log_probs=np.array([log_mu]), advantages=np.array([0.7]),
                  values=np.zeros(1), proximal_values=np.zeros(1), returns=np.zeros(1),
                  entropy=np.zeros(1), mask=np.ones(1))
    _, metrics, grads = _decoupled(inputs, clip_epsilon=0.2, behaviour_weight_clip=c_bar)
    r, w = np.exp(-0.95 - log_prox), min(c_bar, np.exp(log_prox - log_mu))
    assert grads['log_probs'][0] == pytest.approx(-w * r * 0.7)
    assert metrics['mean_ratio'] == pytest.approx(r)
    assert metrics['behaviour_weight'] == pytest.approx(w)


def test_decoupled_is_ppo_clip_when_the_proximal_policy_acted():
  inputs = _ppo_inputs(np.random.default_rng(3))
  kwargs = dict(clip_epsilon=0.2, value_clip=0.2, baseline_cost=0.5, entropy_cost=0.01)
  loss, metrics, grads = _ppo(inputs, **kwargs)
  decoupled = dict(log_probs=inputs['log_probs'],
                   proximal_log_probs=inputs['behaviour_log_probs'],
                   behaviour_log_probs=inputs['behaviour_log_probs'],
                   advantages=inputs['advantages'], values=inputs['values'],
                   proximal_values=inputs['behaviour_values'], returns=inputs['returns'],
                   entropy=inputs['entropy'], mask=inputs['mask'])
  d_loss, d_metrics, d_grads = _decoupled(decoupled, behaviour_weight_clip=1.0, **kwargs)
  assert d_loss == pytest.approx(loss, rel=1e-12)
  for name, value in metrics.items():
    assert d_metrics[name] == pytest.approx(value, rel=1e-12), name
  assert d_metrics['behaviour_weight'] == 1.0 and d_metrics['behaviour_kl'] == 0.0
  np.testing.assert_allclose(d_grads['log_probs'], grads['log_probs'], rtol=1e-12)


def test_behaviour_weights_ignore_garbage_at_masked_entries():
  proximal = np.array([-1.0, 80.0, -2.0])
  behaviour = np.array([-1.2, -80.0, np.nan])
  mask = np.array([1.0, 0.0, 0.0])
  weights, metrics = losses.behaviour_weights(tf.constant(proximal), tf.constant(behaviour),
                                              tf.constant(mask), clip=1.0)
  np.testing.assert_array_equal(weights.numpy(), [1.0, 0.0, 0.0])
  assert metrics['behaviour_weight_clipped'].numpy() == 1.0
  assert np.isfinite(metrics['behaviour_kl'].numpy())


def reference_running_returns(rewards, first, mask, gamma, initial):
  """The normalizer's return as an explicit discounted sum back to where it started
  (the episode's first transition, or the carried-in return before the unroll)."""
  T, B = rewards.shape
  out = np.zeros((T, B))
  for b in range(B):
    for t in range(T):
      if mask[t, b] == 0:
        continue
      total, s = 0.0, t
      while True:
        total += GAMMA_R ** (t - s) * rewards[s, b]
        if first[s, b]:
          break
        if s == 0:
          total += GAMMA_R ** (t + 1) * initial[b]
          break
        if mask[s - 1, b] == 0:
          break
        s -= 1
      out[t, b] = total
  return out


GAMMA_R = 0.97


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_running_returns_match_reference(seed):
  rng = np.random.default_rng(seed)
  T, B = 9, 4
  rewards = rng.normal(0, 1, (T, B))
  mask = (rng.random((T, B)) > 0.2).astype(np.float64)
  first = np.zeros((T, B))
  first[1:][mask[:-1] == 0] = 1.0  # after a LAST step comes a FIRST one
  first[0, 1] = 1.0  # an unroll that starts an episode drops what was carried in
  mask[0, 0], first[0, 0] = 1.0, 0.0  # column 0 continues the carried-in return
  initial = rng.normal(0, 3, B)
  out, final = losses.running_returns(tf.constant(rewards), tf.constant(first),
                                      tf.constant(mask), GAMMA_R, tf.constant(initial))
  expected = reference_running_returns(rewards, first, mask, GAMMA_R, initial)
  np.testing.assert_allclose(out.numpy(), expected, atol=1e-12)
  np.testing.assert_array_equal(final.numpy(), out.numpy()[-1])
  assert out.numpy()[0, 0] == pytest.approx(rewards[0, 0] + GAMMA_R * initial[0])
  assert out.numpy()[0, 1] == pytest.approx(rewards[0, 1] * mask[0, 1])  # restarted


def reference_proximal_drift(log_probs, proximal_log_probs, mask, eps):
  """Slow reference: the share outside [1 - eps, 1 + eps] and the approximate KL of
  pi / pi_prox over unmasked entries, one entry at a time."""
  clipped = kl = n = 0.0
  for idx in np.ndindex(log_probs.shape):
    if not mask[idx]:
      continue
    r = np.exp(log_probs[idx] - proximal_log_probs[idx])
    clipped += float(abs(r - 1) > eps)
    kl += (r - 1) - np.log(r)
    n += 1
  return {'proximal_clip_fraction': clipped / max(n, 1), 'proximal_approx_kl': kl / max(n, 1)}


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_proximal_drift_matches_reference_and_equals_the_decoupled_metrics(seed):
  """The proximal policy's drift is what the decoupled objective reports as its clip
  fraction and KL; masked entries (here holding inf) count for nothing."""
  inputs = _decoupled_inputs(np.random.default_rng(seed))
  log_probs, prox = inputs['log_probs'].copy(), inputs['proximal_log_probs']
  mask = inputs['mask']
  log_probs[mask == 0] = np.inf
  drift = losses.proximal_drift(tf.constant(log_probs), tf.constant(prox),
                                tf.constant(mask), 0.1)
  ref = reference_proximal_drift(log_probs, prox, mask, 0.1)
  assert 0.0 < ref['proximal_clip_fraction'] < 1.0
  for name, value in ref.items():
    assert float(drift[name]) == pytest.approx(value, rel=1e-10), name
  inputs['log_probs'] = np.where(mask > 0, log_probs, 0.0)
  _, metrics, _ = _decoupled(inputs, clip_epsilon=0.1)
  assert float(drift['proximal_clip_fraction']) == pytest.approx(metrics['clip_fraction'])
  assert float(drift['proximal_approx_kl']) == pytest.approx(metrics['approx_kl'])
