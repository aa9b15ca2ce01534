"""The V-trace learner's optimizers: Adam (SEED's) or RMSprop as IMPALA ran it.

IMPALA's Atari runs used TF1's `RMSPropOptimizer` (decay 0.99, momentum 0, epsilon 0.01,
lr 6e-4) on a loss *summed* over 32 unrolls of 20 steps. TF1's RMSprop starts the mean
square at 1.0 where Sonnet 2's `snt.optimizers.RMSProp` starts it at 0, so the rule is
written here: with 1.0 the first ~100 updates are SGD-like (a warm-up for free) instead
of full-size steps in the sign of the first gradients. Epsilon sits inside the square
root in both. Our losses are means over the
batch's transitions (as SEED's), so the constants below translate IMPALA's
for a mean (`MEAN_LOSS_*`): a mean's gradient is the sum's divided by N = 640, and the
rule is unchanged when `initial_ms` and `epsilon` are divided by N^2.
"""

from typing import Sequence

import sonnet as snt
import tensorflow as tf

# IMPALA's Atari RMSprop, for a loss summed over its 32 x 20 transitions.
IMPALA_DECAY = 0.99
IMPALA_EPSILON = 0.01
IMPALA_INITIAL_MS = 1.0
IMPALA_TRANSITIONS = 32 * 20


class RMSProp(snt.Optimizer):
  """ms <- decay ms + (1 - decay) g^2;  mom <- momentum mom + lr g / sqrt(ms + eps);  w -= mom.

  TF1 semantics: `ms` starts at `initial_ms`, epsilon is inside the square root.
  """

  def __init__(self, learning_rate: float, decay: float = IMPALA_DECAY,
               momentum: float = 0.0, epsilon: float = IMPALA_EPSILON,
               initial_ms: float = IMPALA_INITIAL_MS, name: str = 'rmsprop'):
    super().__init__(name=name)
    self.learning_rate = learning_rate
    self.decay = decay
    self.momentum = momentum
    self.epsilon = epsilon
    self.initial_ms = initial_ms
    self.ms: list = []
    self.mom: list = []

  @snt.once
  def _initialize(self, parameters: Sequence[tf.Variable]):
    with tf.name_scope('ms'):
      self.ms.extend(tf.Variable(tf.fill(p.shape, tf.cast(self.initial_ms, p.dtype)),
                                 trainable=False) for p in parameters)
    with tf.name_scope('momentum'):
      self.mom.extend(tf.Variable(tf.zeros_like(p), trainable=False) for p in parameters)

  def apply(self, updates: Sequence[tf.Tensor], parameters: Sequence[tf.Variable]):
    self._initialize(parameters)
    for g, p, ms, mom in zip(updates, parameters, self.ms, self.mom):
      if g is None:
        continue
      ms.assign(self.decay * ms + (1.0 - self.decay) * tf.square(g))
      mom.assign(self.momentum * mom + self.learning_rate * g * tf.math.rsqrt(ms + self.epsilon))
      p.assign_sub(mom)


# The same constants for a loss averaged over transitions (ours and SEED's): a mean's
# gradient is the sum's divided by 640, so the mean square and epsilon scale by 640^2.
MEAN_LOSS_EPSILON = IMPALA_EPSILON / IMPALA_TRANSITIONS ** 2  # 2.4e-8
MEAN_LOSS_INITIAL_MS = IMPALA_INITIAL_MS / IMPALA_TRANSITIONS ** 2  # 2.4e-6


def make_optimizer(config) -> snt.Optimizer:
  """The optimizer a `VTraceConfig` names ('adam' or 'rmsprop')."""
  if config.optimizer == 'adam':
    return snt.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
  if config.optimizer == 'rmsprop':
    return RMSProp(config.learning_rate, decay=config.rmsprop_decay,
                   momentum=config.rmsprop_momentum, epsilon=config.rmsprop_epsilon,
                   initial_ms=config.rmsprop_initial_ms)
  raise ValueError(f"VTraceConfig.optimizer must be 'adam' or 'rmsprop', got "
                   f'{config.optimizer!r}')
