"""PPO (Schulman et al., 2017) as pure functions over time-major tensors.

Shapes and conventions are V-trace's (`agents/vtrace/losses.py`): T transitions, B
unrolls; `rewards[t]`, `discounts[t]` (gamma times the env discount) belong to the
transition x_t -> x_{t+1}; `values[t] = V(x_t)`; `bootstrap_value = V(x_T)`.

`mask[t] = 0` marks a transition that does not exist (x_t is an episode's LAST step,
x_{t+1} the next episode's FIRST). It has no TD error and zero advantage, cuts the
trace, and is left out of every loss term and every mean. A time-limit truncation keeps
discount gamma on the step into LAST, so the LAST observation's value is bootstrapped.

Advantage estimation is split from the loss because SEED's unrolls can be stale: the
learner picks GAE for on-policy data or V-trace-corrected advantages for lagging actors,
then runs the same clipped surrogate over minibatches of either.

The surrogate's anchor is a choice too. Plain PPO-clip (`ppo_loss` with the behaviour
log-probs) centres the trust region on the policy that acted, which in SEED is several
learner steps old. The decoupled objective (Hilton et al. 2021, "Batch size-invariance
for policy optimization"; `decoupled_ppo_loss`) centres it on the proximal policy (the
network as the learner batch arrives) and corrects for the behaviour policy with a
truncated importance weight min(c_bar, pi_prox / mu), constant in the parameters.

`running_returns` is the reward normalizer's discounted return (gymnasium's
`NormalizeReward`), carried in from the env's previous unroll.
"""

from typing import Dict, NamedTuple, Tuple

import tensorflow as tf


class GaeReturns(NamedTuple):
  advantages: tf.Tensor  # [T, B] policy-gradient advantages, 0 at masked transitions
  returns: tf.Tensor  # [T, B] value targets


def _next_values(values: tf.Tensor, bootstrap_value: tf.Tensor) -> tf.Tensor:
  """V(x_{t+1}) for t = 0 .. T-1: `values` shifted by one, then `bootstrap_value`."""
  return tf.concat([values[1:], bootstrap_value[None]], axis=0)


def _constant(x, dtype: tf.DType) -> tf.Tensor:
  """`x` (a Python number or a tensor) in `dtype`, without a float32 detour for floats."""
  return tf.cast(tf.convert_to_tensor(x, dtype_hint=dtype), dtype)


def _backward_sum(deltas: tf.Tensor, coefficients: tf.Tensor) -> tf.Tensor:
  """acc_t = deltas_t + coefficients_t * acc_{t+1}, acc_T = 0, by a reverse scan."""
  return tf.scan(lambda acc, x: x[0] + x[1] * acc, (deltas, coefficients),
                 initializer=tf.zeros_like(deltas[0]), reverse=True)


def gae(rewards: tf.Tensor, discounts: tf.Tensor, values: tf.Tensor,
        bootstrap_value: tf.Tensor, mask: tf.Tensor, lambda_: float) -> GaeReturns:
  """Generalised advantage estimation (Schulman et al., 2016).

      delta_t = r_t + discounts_t V(x_{t+1}) - V(x_t)
      A_t = mask_t (delta_t + discounts_t lambda A_{t+1}),  A_T = 0
      returns_t = A_t + V(x_t)

  All inputs `[T, B]` except `bootstrap_value` `[B]`. Returns stop-gradient targets.
  """
  mask = tf.cast(mask, values.dtype)
  deltas = mask * (rewards + discounts * _next_values(values, bootstrap_value) - values)
  advantages = _backward_sum(deltas, mask * discounts * _constant(lambda_, values.dtype))
  return GaeReturns(tf.stop_gradient(advantages), tf.stop_gradient(advantages + values))


def vtrace_advantages(target_log_probs: tf.Tensor, behaviour_log_probs: tf.Tensor,
                      rewards: tf.Tensor, discounts: tf.Tensor, values: tf.Tensor,
                      bootstrap_value: tf.Tensor, mask: tf.Tensor, lambda_: float = 1.0,
                      clip_rho_threshold: float = 1.0,
                      clip_c_threshold: float = 1.0) -> GaeReturns:
  """V-trace-corrected advantages for stale unrolls (IMPALA, Remark 1, with lambda).

      vs_t - V(x_t) = rho_t delta_t + discounts_t c_t (vs_{t+1} - V(x_{t+1}))
      rho_t = min(rho_bar, pi/mu), c_t = lambda min(c_bar, pi/mu)
      A_t = rho_t (r_t + discounts_t vs_{t+1} - V(x_t)),  returns_t = vs_t

  Same recursion as `seedacme.agents.vtrace.losses.vtrace_returns` (equal at
  lambda_ = 1), which has no lambda, so it is written here over GAE's backward sum. On
  policy it reduces to GAE(lambda)'s returns. Returns stop-gradient targets.
  """
  mask = tf.cast(mask, values.dtype)
  discounts = mask * discounts
  rhos = tf.exp(target_log_probs - behaviour_log_probs)
  clipped_rhos = tf.minimum(_constant(clip_rho_threshold, rhos.dtype), rhos)
  cs = _constant(lambda_, rhos.dtype) * tf.minimum(_constant(clip_c_threshold, rhos.dtype),
                                                   rhos)
  deltas = mask * clipped_rhos * (
      rewards + discounts * _next_values(values, bootstrap_value) - values)
  vs = values + _backward_sum(deltas, discounts * cs)
  advantages = mask * clipped_rhos * (
      rewards + discounts * _next_values(vs, bootstrap_value) - values)
  return GaeReturns(tf.stop_gradient(advantages), tf.stop_gradient(vs))


def running_returns(rewards: tf.Tensor, first: tf.Tensor, mask: tf.Tensor, gamma: float,
                    initial: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """The discounted return the reward normalizer tracks, continued across unrolls.

      g_t = mask_t (r_t + gamma (1 - first_t) g_{t-1}),  g_{-1} = initial

  `first[t]` marks x_t as an episode's FIRST step (the return restarts), `mask[t] = 0`
  a transition that does not exist (x_t is LAST: the return ends). Inputs `[T, B]`,
  `initial` `[B]` (what the env's previous unroll ended with). Returns `(g [T, B],
  g_{T-1} [B])`: the second is the next unroll's `initial`.
  """
  mask = tf.cast(mask, rewards.dtype)
  keep = _constant(gamma, rewards.dtype) * (1.0 - tf.cast(first, rewards.dtype))
  returns = tf.scan(lambda g, x: x[2] * (x[0] + x[1] * g), (rewards, keep, mask),
                    initializer=tf.cast(initial, rewards.dtype))
  return returns, returns[-1]


def _masked_mean(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Mean of `x` over `mask > 0`; `tf.where` keeps garbage (inf/nan) at masked entries out."""
  count = tf.maximum(tf.reduce_sum(mask), 1.0)
  return tf.reduce_sum(tf.where(mask > 0, x, tf.zeros_like(x))) / count


def _ratio_metrics(log_ratio: tf.Tensor, ratio: tf.Tensor, mask: tf.Tensor,
                   clip_epsilon: float) -> Dict[str, tf.Tensor]:
  """The share of unmasked samples whose ratio left [1 - eps, 1 + eps], and the
  approximate KL ((r - 1) - log r) of the ratio's two policies."""
  return {
      'clip_fraction': _masked_mean(
          tf.cast(tf.abs(ratio - 1.0) > clip_epsilon, mask.dtype), mask),
      'approx_kl': _masked_mean((ratio - 1.0) - log_ratio, mask),
  }


def normalize_advantages(advantages: tf.Tensor, mask: tf.Tensor,
                         epsilon: float = 1e-8) -> tf.Tensor:
  """(A - mean) / (std + epsilon) over the unmasked entries; masked entries are 0."""
  mask = tf.cast(mask, advantages.dtype)
  mean = _masked_mean(advantages, mask)
  std = tf.sqrt(_masked_mean(tf.square(advantages - mean), mask))
  normalized = (advantages - mean) / (std + epsilon)
  return tf.where(mask > 0, normalized, tf.zeros_like(normalized))


def ppo_loss(log_probs: tf.Tensor, behaviour_log_probs: tf.Tensor, advantages: tf.Tensor,
             values: tf.Tensor, behaviour_values: tf.Tensor, returns: tf.Tensor,
             entropy: tf.Tensor, mask: tf.Tensor, clip_epsilon: float = 0.2,
             value_clip: float | None = None, baseline_cost: float = 0.5,
             entropy_cost: float = 0.0, weights: tf.Tensor | None = None
             ) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """PPO's clipped surrogate + baseline_cost * value loss - entropy_cost * entropy.

      ratio = exp(log_probs - behaviour_log_probs)
      policy_loss = -mean(w min(ratio A, clip(ratio, 1 - eps, 1 + eps) A))
      value_loss = 0.5 mean((V - R)^2), or with `value_clip` c (PPO2)
                   0.5 mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))

  Args:
    log_probs: log pi(a|x) of the actions under the policy being learned (differentiable).
    behaviour_log_probs: the ratio's denominator, the trust region's centre: log mu(a|x)
      the data was collected with (PPO-clip), or the proximal policy's
      (`decoupled_ppo_loss`).
    advantages, returns: targets (gradient stopped here).
    values: V(x) being learned; behaviour_values: V_old(x) for value clipping (the
      values at the same centre).
    entropy: the policy's entropy at each x.
    mask: 0 for entries that are no transition. Every input has the same shape (any
      rank: the learner passes time-major minibatches `[T, b]`).

  Returns:
    (loss, metrics). Every mean is over the unmasked entries.
  """
  mask = tf.cast(mask, values.dtype)
  # Zero every input at masked entries first: whatever sits there (even inf or nan) then
  # reaches neither the loss nor, through a where's zero-times-nan, the gradients.
  zero_masked = lambda x: tf.where(mask > 0, x, tf.zeros_like(x))
  log_probs, values, entropy = map(zero_masked, (log_probs, values, entropy))
  advantages, returns, behaviour_log_probs, behaviour_values = (
      tf.stop_gradient(zero_masked(x))
      for x in (advantages, returns, behaviour_log_probs, behaviour_values))
  weights = (tf.ones_like(advantages) if weights is None
             else tf.stop_gradient(zero_masked(tf.cast(weights, advantages.dtype))))

  log_ratio = log_probs - behaviour_log_probs
  ratio = tf.exp(log_ratio)
  clipped_ratio = tf.clip_by_value(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
  surrogate = weights * tf.minimum(ratio * advantages, clipped_ratio * advantages)
  policy_loss = -_masked_mean(surrogate, mask)

  value_error = tf.square(values - returns)
  if value_clip is not None:
    clipped_values = behaviour_values + tf.clip_by_value(
        values - behaviour_values, -value_clip, value_clip)
    value_error = tf.maximum(value_error, tf.square(clipped_values - returns))
  value_loss = 0.5 * _masked_mean(value_error, mask)

  mean_entropy = _masked_mean(entropy, mask)
  loss = policy_loss + baseline_cost * value_loss - entropy_cost * mean_entropy

  metrics = {
      'loss': loss,
      'policy_loss': policy_loss,
      'value_loss': value_loss,
      'entropy': mean_entropy,
      **_ratio_metrics(log_ratio, ratio, mask, clip_epsilon),
      'mean_ratio': _masked_mean(ratio, mask),
  }
  return loss, {k: tf.stop_gradient(v) for k, v in metrics.items()}


def proximal_drift(log_probs: tf.Tensor, proximal_log_probs: tf.Tensor, mask: tf.Tensor,
                   clip_epsilon: float) -> Dict[str, tf.Tensor]:
  """How far the policy has moved from the proximal one (the network as the batch
  arrived) over the learner step's epochs, whatever the objective's anchor: the share
  of samples whose ratio pi / pi_prox left [1 - eps, 1 + eps], and the approximate KL.
  Under the decoupled objective these are its `clip_fraction` and `approx_kl`; under
  plain clip, whose ratio is to the behaviour policy, they leave the data's lag out.
  No gradient."""
  mask = tf.cast(mask, log_probs.dtype)
  log_ratio = tf.stop_gradient(tf.where(mask > 0, log_probs - proximal_log_probs,
                                        tf.zeros_like(log_probs)))
  metrics = _ratio_metrics(log_ratio, tf.exp(log_ratio), mask, clip_epsilon)
  return {f'proximal_{name}': value for name, value in metrics.items()}


def behaviour_weights(proximal_log_probs: tf.Tensor, behaviour_log_probs: tf.Tensor,
                      mask: tf.Tensor, clip: float = 1.0
                      ) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """The decoupled objective's behaviour correction, truncated: min(clip, pi_prox / mu).

  Returns `(weights, metrics)`: weights are 0 at masked entries and carry no gradient;
  metrics are the mean weight, the fraction truncated and the approximate KL of the
  proximal policy from the behaviour policy (how stale the data is), over unmasked
  entries.
  """
  mask = tf.cast(mask, proximal_log_probs.dtype)
  log_rho = tf.stop_gradient(tf.where(mask > 0, proximal_log_probs - behaviour_log_probs,
                                      tf.zeros_like(proximal_log_probs)))
  rho = tf.exp(log_rho)
  clip = _constant(clip, rho.dtype)
  weights = tf.where(mask > 0, tf.minimum(clip, rho), tf.zeros_like(rho))
  metrics = {
      'behaviour_weight': _masked_mean(weights, mask),
      'behaviour_weight_clipped': _masked_mean(tf.cast(rho > clip, mask.dtype), mask),
      'behaviour_kl': _masked_mean((rho - 1.0) - log_rho, mask),
  }
  return weights, metrics


def decoupled_ppo_loss(log_probs: tf.Tensor, proximal_log_probs: tf.Tensor,
                       behaviour_log_probs: tf.Tensor, advantages: tf.Tensor,
                       values: tf.Tensor, proximal_values: tf.Tensor, returns: tf.Tensor,
                       entropy: tf.Tensor, mask: tf.Tensor, clip_epsilon: float = 0.2,
                       value_clip: float | None = None, baseline_cost: float = 0.5,
                       entropy_cost: float = 0.0, behaviour_weight_clip: float = 1.0,
                       correct_behaviour: bool = True
                       ) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
  """Decoupled PPO (Hilton et al. 2021): the clip centred on the proximal policy.

      r = pi / pi_prox,  w = min(c_bar, pi_prox / mu)   (constants in the parameters)
      policy_loss = -mean(w min(r A, clip(r, 1 - eps, 1 + eps) A))

  and the value clip (if any) centred on the proximal values. When pi_prox = mu and
  c_bar >= 1 this is `ppo_loss` exactly. `correct_behaviour=False` leaves w = 1 for
  advantages that already carry the correction (V-trace's rho); the weight's metrics
  are reported either way. `clip_fraction`, `approx_kl` and `mean_ratio` are against
  the proximal policy.
  """
  weights, weight_metrics = behaviour_weights(proximal_log_probs, behaviour_log_probs,
                                              mask, behaviour_weight_clip)
  loss, metrics = ppo_loss(log_probs, proximal_log_probs, advantages, values,
                           proximal_values, returns, entropy, mask,
                           clip_epsilon=clip_epsilon, value_clip=value_clip,
                           baseline_cost=baseline_cost, entropy_cost=entropy_cost,
                           weights=weights if correct_behaviour else None)
  metrics.update(weight_metrics)
  return loss, metrics
