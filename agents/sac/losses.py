"""SAC (Haarnoja et al., 2018, with automatic temperature) as pure functions over tensors.

A learner samples transitions (or n-step sequences, folded by the learner's
`n_step_transitions`) from
Reverb, evaluates its networks, and hands the resulting tensors to these functions; the
functions own no variables (`polyak_update` only assigns to the ones it is given), so
each can be checked against a slow numpy reference and traced into any tf.function.
Everything is batch-major: `[B]` per transition.

`discounts` in `critic_loss` is the full bootstrap coefficient gamma^n times the env
discounts' product: 0 after a termination, gamma^n after a time-limit truncation (the
last observation is then bootstrapped). `rewards` are then the n-step discounted sums.

Log-prob units. Every `log_prob` here is the log-density of the tanh-squashed action
y = tanh(u) in [-1, 1]^A, the units SAC's usual target entropy -A is set in. The shared
`seedacme.distributions.NormalHead` returns the density of the env action
a = center + half_span * y, which is lower by the constant `affine_log_det`
= sum log(half_span), so a SAC actor *adds* it back:

    log_prob = head.log_prob(params, u) + head.affine_log_det  # == unit_log_prob(...)

(log p(a) = log p(y) - sum log(half_span); subtracting would double the offset.) With
bounds [-1, 1] the constant is 0. It matters most to `temperature_loss`: in env units
the entropy compared with -A would be off by `affine_log_det` (e.g. +A log 2 for
bounds [-2, 2]) and alpha would settle at the wrong entropy. In the actor and critic
losses it only shifts every soft value by a constant, but all three use the same
[-1, 1] units so that `entropy` metrics and targets read alike for every env.

Each loss returns `(loss, metrics)` with the metrics' gradients stopped. Inputs are
checked for equal static shapes: a critic's `[B, 1]` output against `[B]` targets would
otherwise broadcast to `[B, B]` and train on the wrong pairs without any error.
"""

from typing import Dict, Sequence, Tuple

import tensorflow as tf

Metrics = Dict[str, tf.Tensor]


def _constant(x, dtype: tf.DType) -> tf.Tensor:
  """`x` (a Python number or a tensor) in `dtype`, without a float32 detour for floats."""
  return tf.cast(tf.convert_to_tensor(x, dtype_hint=dtype), dtype)


def _check_same_shape(where: str, **tensors: tf.Tensor) -> None:
  """Raises ValueError if the tensors' static shapes disagree (unknown dims pass)."""
  (first_name, first), *rest = tensors.items()
  for name, tensor in rest:
    if not first.shape.is_compatible_with(tensor.shape):
      raise ValueError(f'{where}: {name} has shape {tensor.shape} but {first_name} has '
                       f'{first.shape}; pass every per-transition input as [B]')


def _stopped(metrics: Metrics) -> Metrics:
  return {k: tf.stop_gradient(v) for k, v in metrics.items()}


def unit_log_prob(head_log_prob: tf.Tensor, affine_log_det: float) -> tf.Tensor:
  """Log-density of tanh(u) in [-1, 1] units from `NormalHead.log_prob`'s env units.

  `affine_log_det` is the head's attribute: sum over dimensions of log(half_span).
  """
  return head_log_prob + _constant(affine_log_det, head_log_prob.dtype)


def critic_loss(q1: tf.Tensor, q2: tf.Tensor, rewards: tf.Tensor, discounts: tf.Tensor,
                next_q1_target: tf.Tensor, next_q2_target: tf.Tensor,
                next_log_prob: tf.Tensor, alpha) -> Tuple[tf.Tensor, Metrics]:
  """Twin soft Q-learning with clipped double-Q targets.

      y = r + discounts * (min(Q1'(x', a'), Q2'(x', a')) - alpha log pi(a'|x'))
      loss = 0.5 mean((Q1(x, a) - y)^2) + 0.5 mean((Q2(x, a) - y)^2)

  Args:
    q1, q2: Q1(x, a), Q2(x, a) of the online critics, `[B]` (differentiable).
    rewards: r (or the n-step discounted sum), `[B]`.
    discounts: gamma^n times the env discounts' product, `[B]` (0 after a termination).
    next_q1_target, next_q2_target: the target critics at (x', a'), a' ~ pi(.|x'), `[B]`.
    next_log_prob: log pi(a'|x') in [-1, 1] units (see the module docstring), `[B]`.
    alpha: the temperature, a scalar (number or tensor).

  Returns:
    (loss, metrics): 'critic_loss' and the means of 'q1', 'q2' and 'target_q' (y).
    No gradient reaches the targets, `next_log_prob` or `alpha`. Where `discounts` is 0
    the next-state terms are dropped by a `where`, so even inf or nan there cannot leak.
  """
  _check_same_shape('critic_loss', q1=q1, q2=q2, rewards=rewards, discounts=discounts,
                    next_q1_target=next_q1_target, next_q2_target=next_q2_target,
                    next_log_prob=next_log_prob)
  alpha = _constant(alpha, q1.dtype)
  soft_next_value = (tf.minimum(next_q1_target, next_q2_target) - alpha * next_log_prob)
  bootstrap = tf.where(discounts > 0, discounts * soft_next_value,
                       tf.zeros_like(soft_next_value))
  target = tf.stop_gradient(rewards + bootstrap)
  q1_loss = 0.5 * tf.reduce_mean(tf.square(q1 - target))
  q2_loss = 0.5 * tf.reduce_mean(tf.square(q2 - target))
  loss = q1_loss + q2_loss
  return loss, _stopped({
      'critic_loss': loss,
      'q1': tf.reduce_mean(q1),
      'q2': tf.reduce_mean(q2),
      'target_q': tf.reduce_mean(target),
  })


def actor_loss(q1_pi: tf.Tensor, q2_pi: tf.Tensor, log_prob: tf.Tensor,
               alpha) -> Tuple[tf.Tensor, Metrics]:
  """The reparameterised policy loss: mean(alpha log pi(a|x) - min(Q1, Q2)(x, a)).

  Args:
    q1_pi, q2_pi: the online critics at (x, a), a = tanh(u) a fresh reparameterised
      sample from pi(.|x), `[B]`; gradients flow through them into the action (the
      learner applies this loss's gradients to the policy's variables only).
    log_prob: log pi(a|x) of that sample in [-1, 1] units, `[B]`.
    alpha: the temperature, a scalar; its gradient is stopped.

  Returns:
    (loss, metrics): 'actor_loss' and 'entropy' (-mean log_prob, a one-sample estimate).
  """
  _check_same_shape('actor_loss', q1_pi=q1_pi, q2_pi=q2_pi, log_prob=log_prob)
  alpha = tf.stop_gradient(_constant(alpha, log_prob.dtype))
  loss = tf.reduce_mean(alpha * log_prob - tf.minimum(q1_pi, q2_pi))
  return loss, _stopped({'actor_loss': loss, 'entropy': -tf.reduce_mean(log_prob)})


def temperature_loss(log_alpha: tf.Tensor, log_prob: tf.Tensor,
                     target_entropy) -> Tuple[tf.Tensor, Metrics]:
  """Automatic temperature: -mean(log_alpha * stop_gradient(log_prob + target_entropy)).

  The gradient w.r.t. log_alpha is mean(H_estimate) - target_entropy with
  H_estimate = -log_prob, so gradient descent raises alpha while the policy's entropy
  is below the target and lowers it while above. Optimising log_alpha (as in the
  authors' code) keeps alpha = exp(log_alpha) positive.

  Args:
    log_alpha: the trainable scalar log-temperature.
    log_prob: log pi(a|x) of fresh policy samples in [-1, 1] units, `[B]` (stopped).
    target_entropy: a scalar, usually -A for A action dimensions.

  Returns:
    (loss, metrics): 'temperature_loss' and 'alpha' (exp(log_alpha)).
  """
  log_alpha = tf.convert_to_tensor(log_alpha)
  gap = tf.stop_gradient(log_prob + _constant(target_entropy, log_prob.dtype))
  loss = -tf.reduce_mean(tf.cast(log_alpha, gap.dtype) * gap)
  return loss, _stopped({'temperature_loss': loss, 'alpha': tf.exp(log_alpha)})


def polyak_update(target_variables: Sequence[tf.Variable],
                  source_variables: Sequence[tf.Variable], tau) -> None:
  """target <- (1 - tau) target + tau source for each pair, in place.

  Written as that weighted sum (not target + tau (source - target)) so that tau = 1
  copies exactly; tau is cast to each variable's dtype first and 1 - tau computed in
  it. Pairs are matched by position, as `snt.Module.variables` lists them. Works eagerly
  and inside tf.function (`tau` may be a tensor there).
  """
  target_variables, source_variables = list(target_variables), list(source_variables)
  if len(target_variables) != len(source_variables):
    raise ValueError(f'polyak_update: {len(target_variables)} target variables but '
                     f'{len(source_variables)} source variables')
  if isinstance(tau, (int, float)) and not 0.0 <= tau <= 1.0:
    raise ValueError(f'polyak_update: tau must be in [0, 1], got {tau}')
  for target, source in zip(target_variables, source_variables):
    if not target.shape.is_compatible_with(source.shape):
      raise ValueError(f'polyak_update: {target.name} has shape {target.shape} but its '
                       f'source {source.name} has {source.shape}')
    tau_t = _constant(tau, target.dtype)
    target.assign((tf.ones([], target.dtype) - tau_t) * target + tau_t * source)
