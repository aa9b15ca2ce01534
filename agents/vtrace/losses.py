"""V-trace (Espeholt et al., 2018, IMPALA) as pure functions over time-major tensors.

Shapes: T transitions, B unrolls. `rewards[t]`, `discounts[t]` belong to the
transition x_t -> x_{t+1}; `values[t] = V(x_t)`; `bootstrap_value = V(x_T)`.

`mask[t] = 0` marks a transition that does not exist: the step after an episode's LAST
step is the FIRST step of the next episode, so the pair (LAST, FIRST) inside an unroll is
no transition at all. Masked transitions contribute no TD error, cut the trace
(discount 0), and are excluded from every loss term -- otherwise a padded or
cross-episode step would teach the policy nonsense (Acme's TF IMPALA collapsed on
CartPole for this reason).
"""

from typing import Dict, NamedTuple, Tuple

import tensorflow as tf


class VTraceReturns(NamedTuple):
  vs: tf.Tensor  # [T, B] value targets
  pg_advantages: tf.Tensor  # [T, B] rho-weighted advantages for the policy gradient


def vtrace_returns(log_rhos: tf.Tensor, discounts: tf.Tensor, rewards: tf.Tensor,
                   values: tf.Tensor, bootstrap_value: tf.Tensor,
                   mask: tf.Tensor | None = None, clip_rho_threshold: float = 1.0,
                   clip_pg_rho_threshold: float = 1.0,
                   clip_c_threshold: float = 1.0) -> VTraceReturns:
  """V-trace targets by the backward recursion (paper, Remark 1).

      vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1}))
      delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
      rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu)
      A_t = rho^pg_t (r_t + gamma_t vs_{t+1} - V(x_t))

  All inputs `[T, B]` except `bootstrap_value` `[B]`. Returns stop-gradient targets.
  """
  if mask is None:
    mask = tf.ones_like(rewards)
  mask = tf.cast(mask, values.dtype)
  discounts = discounts * mask
  rhos = tf.exp(log_rhos)
  clipped_rhos = tf.minimum(clip_rho_threshold, rhos)
  cs = tf.minimum(clip_c_threshold, rhos)
  values_tp1 = tf.concat([values[1:], bootstrap_value[None]], axis=0)
  deltas = mask * clipped_rhos * (rewards + discounts * values_tp1 - values)

  def backward(acc, inputs):
    delta, discount_c = inputs
    return delta + discount_c * acc

  vs_minus_v = tf.scan(backward, (deltas, discounts * cs),
                       initializer=tf.zeros_like(bootstrap_value), reverse=True)
  vs = values + vs_minus_v
  vs_tp1 = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
  pg_rhos = tf.minimum(clip_pg_rho_threshold, rhos)
  pg_advantages = mask * pg_rhos * (rewards + discounts * vs_tp1 - values)
  return VTraceReturns(tf.stop_gradient(vs), tf.stop_gradient(pg_advantages))


def vtrace_loss(target_logits: tf.Tensor, behaviour_logits: tf.Tensor,
                actions: tf.Tensor, rewards: tf.Tensor, discounts: tf.Tensor,
                values: tf.Tensor, bootstrap_value: tf.Tensor,
                mask: tf.Tensor | None = None, baseline_cost: float = 0.5,
                entropy_cost: float = 0.01, clip_rho_threshold: float = 1.0,
                clip_pg_rho_threshold: float = 1.0,
                clip_c_threshold: float = 1.0) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """IMPALA's loss: policy gradient + baseline_cost * 0.5 (vs - V)^2 - entropy bonus.

  Args:
    target_logits: `[T, B, A]` logits of the policy being learned (differentiable).
    behaviour_logits: `[T, B, A]` logits the actors acted with.
    actions: `[T, B]` int actions taken.
    rewards, discounts, values, mask: `[T, B]` (see module docstring).
    bootstrap_value: `[B]`.

  Returns:
    (loss, metrics). Every term is averaged over the unmasked transitions.
  """
  actions = tf.cast(actions, tf.int32)
  target_log_probs = tf.nn.log_softmax(target_logits)
  behaviour_log_probs = tf.nn.log_softmax(behaviour_logits)
  one_hot = tf.one_hot(actions, tf.shape(target_logits)[-1], dtype=target_logits.dtype)
  entropy = -tf.reduce_sum(tf.nn.softmax(target_logits) * target_log_probs, axis=-1)
  return vtrace_loss_from_log_probs(
      tf.reduce_sum(target_log_probs * one_hot, axis=-1),
      tf.reduce_sum(behaviour_log_probs * one_hot, axis=-1), entropy, rewards, discounts,
      values, bootstrap_value, mask, baseline_cost, entropy_cost, clip_rho_threshold,
      clip_pg_rho_threshold, clip_c_threshold)


def vtrace_loss_from_log_probs(
    target_action_log_probs: tf.Tensor, behaviour_action_log_probs: tf.Tensor,
    entropy: tf.Tensor, rewards: tf.Tensor, discounts: tf.Tensor, values: tf.Tensor,
    bootstrap_value: tf.Tensor, mask: tf.Tensor | None = None, baseline_cost: float = 0.5,
    entropy_cost: float = 0.01, clip_rho_threshold: float = 1.0,
    clip_pg_rho_threshold: float = 1.0,
    clip_c_threshold: float = 1.0) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """`vtrace_loss` for any action distribution: the log-probabilities `[T, B]` of the
  actions taken under the learned (differentiable) and the behaviour policy, and the
  learned policy's entropy `[T, B]` (continuous actions: `seedacme.distributions`)."""
  if mask is None:
    mask = tf.ones_like(rewards)
  mask = tf.cast(mask, values.dtype)
  log_rhos = tf.stop_gradient(target_action_log_probs) - behaviour_action_log_probs
  returns = vtrace_returns(log_rhos, discounts, rewards, tf.stop_gradient(values),
                           tf.stop_gradient(bootstrap_value), mask,
                           clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold)
  count = tf.maximum(tf.reduce_sum(mask), 1.0)
  pg_loss = -tf.reduce_sum(mask * returns.pg_advantages * target_action_log_probs) / count
  baseline_loss = tf.reduce_sum(mask * 0.5 * tf.square(returns.vs - values)) / count
  mean_entropy = tf.reduce_sum(mask * entropy) / count
  loss = pg_loss + baseline_cost * baseline_loss - entropy_cost * mean_entropy
  metrics = {'loss': loss, 'pg_loss': pg_loss, 'baseline_loss': baseline_loss,
             'entropy': mean_entropy,
             'mean_rho': tf.reduce_sum(mask * tf.exp(log_rhos)) / count}
  return loss, metrics
