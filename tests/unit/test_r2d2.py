"""R2D2 pieces against slow numpy references: value rescaling, n-step double-Q targets
across episode ends, priorities, the Ape-X epsilon schedule and per-env exploration."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.r2d2 import acting, losses, priorities
from seedacme.types import EnvSpec


def ref_h(x, eps=1e-3):
  return np.sign(x) * (np.sqrt(np.abs(x) + 1) - 1) + eps * x


def ref_n_step(r, g, mask, v, n):
  """Literal definition: sum rewards until n steps, an episode's LAST state, or the end."""
  T, B = r.shape
  out = np.zeros((T, B))
  for b in range(B):
    for t in range(T):
      total, coef = 0.0, 1.0
      for k in range(n):
        j = t + k
        if j >= T or mask[j, b] == 0:  # x_j ends the episode or the sequence
          total += coef * v[j, b]
          break
        total += coef * r[j, b]
        coef *= g[j, b]
      else:
        total += coef * v[t + n, b]
      out[t, b] = total
  return out


def test_value_rescale_and_inverse_round_trip():
  x = np.concatenate([np.linspace(-1e4, 1e4, 2001), [0.0, 1e-6, -1e-6, 0.5, -0.5]])
  h = losses.value_rescale(tf.constant(x, tf.float64)).numpy()
  np.testing.assert_allclose(h, ref_h(x), rtol=1e-12, atol=1e-12)
  back = losses.inverse_value_rescale(tf.constant(h, tf.float64)).numpy()
  np.testing.assert_allclose(back, x, rtol=1e-8, atol=1e-8)
  np.testing.assert_allclose(priorities.inverse_value_rescale(priorities.value_rescale(x)), x,
                             rtol=1e-8, atol=1e-8)
  assert np.all(np.diff(h[:2001]) > 0)  # strictly increasing, so invertible


@pytest.mark.parametrize('n', [1, 3, 5])
@pytest.mark.parametrize('seed', [0, 1])
def test_n_step_returns_match_reference_across_episode_ends(n, seed):
  rng = np.random.default_rng(seed)
  T, B = 12, 5
  r = rng.normal(size=(T, B))
  g = 0.9 * (rng.random((T, B)) > 0.2)  # terminations (discount 0) and truncations (0.9)
  mask = (rng.random((T, B)) > 0.2).astype(np.float64)  # LAST->FIRST steps
  v = rng.normal(size=(T + 1, B))
  expected = ref_n_step(r, g, mask, v, n)
  tf_out = losses.n_step_returns(*[tf.constant(a) for a in (r, g, mask, v)], n).numpy()
  np.testing.assert_allclose(tf_out, expected, rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(priorities.n_step_returns(r, g, mask, v, n), expected,
                             rtol=1e-12, atol=1e-12)


def test_n_step_truncation_bootstraps_from_last_state_and_termination_does_not():
  r = np.array([[1.0], [1.0], [9.0]])
  mask = np.array([[1.0], [0.0], [1.0]])  # x_1 is LAST
  v = np.array([[0.0], [5.0], [0.0], [0.0]])
  truncated = ref_n_step(r, np.array([[0.5], [0.5], [0.5]]), mask, v, 3)
  terminated = ref_n_step(r, np.array([[0.0], [0.5], [0.5]]), mask, v, 3)
  assert truncated[0, 0] == pytest.approx(1.0 + 0.5 * 5.0)
  assert terminated[0, 0] == pytest.approx(1.0)
  tf_out = losses.n_step_returns(*[tf.constant(a) for a in (r, np.full((3, 1), 0.5), mask, v)], 3)
  assert tf_out.numpy()[0, 0] == pytest.approx(3.5)
  # The production functions (the learner's and the server's) on both cases.
  for n_step_returns in (
      lambda *a: losses.n_step_returns(*[tf.constant(x) for x in a], 3).numpy(),
      lambda *a: priorities.n_step_returns(*a, 3)):
    assert n_step_returns(r, np.array([[0.5], [0.5], [0.5]]), mask, v)[0, 0] == \
        pytest.approx(1.0 + 0.5 * 5.0)
    assert n_step_returns(r, np.array([[0.0], [0.5], [0.5]]), mask, v)[0, 0] == \
        pytest.approx(1.0)


def test_priorities_mix_max_and_mean_of_valid_steps():
  td = np.array([[1.0, -2.0], [-3.0, 0.5], [100.0, 1.0]])
  mask = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
  out = losses.priorities_from_td(tf.constant(td), tf.constant(mask), 0.9).numpy()
  expected = [0.9 * 3.0 + 0.1 * 2.0, 0.9 * 2.0 + 0.1 * (3.5 / 3)]
  np.testing.assert_allclose(out, expected)


def test_loss_uses_online_argmax_and_target_values():
  # One transition, n=1, gamma 0 for the step after: bootstrap irrelevant except through
  # the double-Q choice at x_1 with discount 1.
  online = np.array([[[0.0, 0.0]], [[1.0, 2.0]]])  # online prefers action 1 at x_1
  target = np.array([[[0.0, 0.0]], [[7.0, 3.0]]])  # target would prefer action 0
  loss, prio, _ = losses.r2d2_loss(
      tf.constant(online), tf.constant(target), tf.constant([[0]]),
      tf.constant([[0.0]], tf.float64), tf.constant([[1.0]], tf.float64),
      tf.constant([[1.0]], tf.float64), tf.constant([1.0], tf.float64), n_step=1)
  h = losses.value_rescale
  expected_target = h(losses.inverse_value_rescale(tf.constant(3.0, tf.float64))).numpy()
  assert float(prio[0]) == pytest.approx(abs(expected_target - 0.0))
  assert float(loss) == pytest.approx(0.5 * expected_target ** 2)


def test_numpy_initial_priorities_agree_with_the_learner_loss():
  rng = np.random.default_rng(4)
  N, L, A, burn_in, n = 3, 9, 4, 2, 3
  q = rng.normal(size=(N, L, A)).astype(np.float32)
  actions = rng.integers(0, A, (N, L))
  rewards = rng.normal(size=(N, L)).astype(np.float32)
  discounts = np.ones((N, L), np.float32)
  step_types = np.ones((N, L), np.int8)
  step_types[0, 4], step_types[0, 5] = 2, 0  # an episode boundary inside sequence 0
  discounts[0, 4] = 0.0
  out = priorities.sequence_priorities(q, actions, rewards, discounts, step_types,
                                       burn_in=burn_in, n_step=n, gamma=0.99, eta=0.9,
                                       rescale_eps=1e-3)
  tm = lambda x: np.swapaxes(x, 0, 1)  # noqa: E731
  qt = tf.constant(tm(q[:, burn_in:]), tf.float64)
  _, expected, _ = losses.r2d2_loss(
      qt, qt, tf.constant(tm(actions[:, burn_in:-1])),
      tf.constant(tm(rewards[:, burn_in + 1:]), tf.float64),
      tf.constant(0.99 * tm(discounts[:, burn_in + 1:]), tf.float64),
      tf.constant(tm(step_types[:, burn_in:-1]) != 2), tf.ones([N], tf.float64), n)
  np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5)


def test_apex_epsilon_schedule():
  eps = acting.apex_epsilons(8)
  assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
  assert np.all(np.diff(eps) < 0)
  np.testing.assert_allclose(eps[3], 0.4 ** (1 + 7 * 3 / 7), rtol=1e-6)
  assert acting.apex_epsilons(1)[0] == pytest.approx(0.4)


def test_server_applies_each_envs_epsilon():
  from seedacme.agents import r2d2
  spec = EnvSpec((3,), 'float32', 4)
  builder = r2d2.R2D2Builder(r2d2.R2D2Config(lstm_size=8, hidden_sizes=(8,)))
  nets = builder.make_networks(spec)
  # Env 0 explores with eps 0.9, env 1 never; env 2 is an evaluation env (greedy).
  policy = acting.R2D2Policy(nets.online, spec, num_train_envs=2, num_envs=3,
                             epsilon_base=0.9, epsilon_alpha=1e9, evaluation_epsilon=0.0)
  obs = np.ones((3, 3), np.float32)
  state = policy.initial_state(3)
  q, _ = nets.online(tf.constant(obs), state)
  best = np.argmax(q.numpy(), axis=-1)
  differs = np.zeros(3)
  reset = np.ones(3, bool)  # every step from the initial state: the same Q each time
  for _ in range(200):
    out = policy.step(np.array([0, 1, 2]), obs, reset, np.array([False, False, True]))
    np.testing.assert_allclose(out.extras['q'], q.numpy(), rtol=1e-5, atol=1e-6)
    differs += out.action != best
  assert differs[0] > 100  # eps 0.9 over 4 actions: ~68% non-greedy
  assert differs[1] == 0 and differs[2] == 0
  np.testing.assert_allclose(policy.epsilon_of(np.array([0, 1, 2]), np.array([False, False, True])),
                             [0.9, 0.0, 0.0], atol=1e-6)
