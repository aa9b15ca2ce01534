"""R2D2's loss pieces as pure functions over time-major tensors.

Shapes: T transitions, B sequences, A actions. As in V-trace, `rewards[t]`,
`discounts[t]` (gamma times the env discount) and `mask[t]` belong to the transition
x_t -> x_{t+1}; `mask[t] = 0` when x_t is an episode's LAST step (no transition), and
`values` has T + 1 entries, one per state x_0 .. x_T.
"""

from typing import Dict, Tuple

import tensorflow as tf


def value_rescale(x: tf.Tensor, eps: float = 1e-3) -> tf.Tensor:
  """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x  (Pohlen et al., 2018)."""
  return tf.sign(x) * (tf.sqrt(tf.abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: tf.Tensor, eps: float = 1e-3) -> tf.Tensor:
  """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
  return tf.sign(x) * (tf.square((tf.sqrt(1.0 + 4.0 * eps * (tf.abs(x) + 1.0 + eps)) - 1.0)
                                 / (2.0 * eps)) - 1.0)


def n_step_returns(rewards: tf.Tensor, discounts: tf.Tensor, mask: tf.Tensor,
                   values: tf.Tensor, n: int) -> tf.Tensor:
  """n-step returns that stop at episode ends and at the end of the sequence.

      G_t = r_t + g_t r_{t+1} + ... + (g_t ... g_{t+m-2}) r_{t+m-1} + (g_t ... g_{t+m-1}) V(x_{t+m})

  with m = min(n, T - t, steps until x_{t+m} is a LAST step). Bootstrapping from a LAST
  state keeps time-limit truncations right (env discount 1) and vanishes for real
  terminations (env discount 0 is in g).

  Args:
    rewards, discounts, mask: `[T, B]`.
    values: `[T + 1, B]` bootstrap values of x_0 .. x_T.
    n: maximum number of rewards summed.
  Returns:
    `[T, B]` returns.
  """
  t_len = tf.shape(rewards)[0]
  pad = tf.zeros([n, tf.shape(rewards)[1]], rewards.dtype)
  r = tf.concat([rewards, pad], 0)
  g = tf.concat([discounts, pad], 0)
  m = tf.concat([tf.cast(mask, rewards.dtype), pad], 0)  # beyond T: no transition
  v = tf.concat([values, tf.repeat(values[-1:], n, axis=0)], 0)  # beyond T: V(x_T)
  returns = tf.zeros_like(rewards)
  coef = tf.ones_like(rewards)
  active = tf.ones_like(rewards)
  for k in range(n):
    m_k, r_k, g_k, v_k = m[k:k + t_len], r[k:k + t_len], g[k:k + t_len], v[k:k + t_len]
    returns += active * (1.0 - m_k) * coef * v_k  # x_{t+k} ends the episode/sequence
    active = active * m_k
    returns += active * coef * r_k
    coef = coef * tf.where(active > 0, g_k, tf.ones_like(g_k))
  return returns + active * coef * v[n:n + t_len]


def priorities_from_td(td: tf.Tensor, mask: tf.Tensor, eta: float) -> tf.Tensor:
  """eta max_t |td| + (1 - eta) mean_t |td| over the valid steps of each sequence ([B])."""
  mask = tf.cast(mask, td.dtype)
  abs_td = tf.abs(td) * mask
  mean = tf.reduce_sum(abs_td, 0) / tf.maximum(tf.reduce_sum(mask, 0), 1.0)
  return eta * tf.reduce_max(abs_td, 0) + (1.0 - eta) * mean


def r2d2_loss(online_q: tf.Tensor, target_q: tf.Tensor, actions: tf.Tensor,
              rewards: tf.Tensor, discounts: tf.Tensor, mask: tf.Tensor,
              importance_weights: tf.Tensor, n_step: int, eta: float = 0.9,
              rescale_eps: float = 1e-3) -> Tuple[tf.Tensor, tf.Tensor, Dict[str, tf.Tensor]]:
  """n-step double-Q loss with value rescaling, importance weights and priorities.

  Args:
    online_q, target_q: `[T + 1, B, A]` Q-values of the online and target networks
      for x_0 .. x_T (after burn-in).
    actions: `[T, B]` actions taken at x_0 .. x_{T-1}.
    rewards, discounts, mask: `[T, B]`.
    importance_weights: `[B]` prioritized-replay correction (max-normalised).
  Returns:
    (loss, new priorities `[B]`, metrics).
  """
  mask = tf.cast(mask, online_q.dtype)
  greedy = tf.argmax(online_q, axis=-1, output_type=tf.int32)  # double Q: online picks
  bootstrap = tf.gather(target_q, greedy, axis=-1, batch_dims=2)  # target evaluates
  returns = n_step_returns(rewards, discounts, mask,
                           inverse_value_rescale(bootstrap, rescale_eps), n_step)
  targets = tf.stop_gradient(value_rescale(returns, rescale_eps))
  q_taken = tf.gather(online_q[:-1], tf.cast(actions, tf.int32), axis=-1, batch_dims=2)
  td = mask * (targets - q_taken)
  per_sequence = 0.5 * tf.reduce_sum(tf.square(td), 0) / tf.maximum(tf.reduce_sum(mask, 0), 1.0)
  loss = tf.reduce_mean(tf.cast(importance_weights, per_sequence.dtype) * per_sequence)
  priorities = priorities_from_td(td, mask, eta)
  metrics = {'loss': loss, 'mean_abs_td': tf.reduce_sum(tf.abs(td)) / tf.maximum(tf.reduce_sum(mask), 1.0),
             'mean_q': tf.reduce_mean(q_taken), 'mean_priority': tf.reduce_mean(priorities)}
  return loss, tf.stop_gradient(priorities), metrics
