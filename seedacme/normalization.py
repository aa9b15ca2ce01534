"""Running observation normalization, shared by central inference and the learner.

A `RunningNormalizer` is a Sonnet module holding its statistics in non-trainable
tf.Variables. Made an attribute of the network, it is in `network.variables` and in
`tf.train.Checkpoint(network=...)`, and the inference server and the learner, which
share the network's objects in one process, normalize with the very same statistics
(no copies to keep in sync). Only `trainable_variables` reach the optimizer.

Statistics are float64 and merged with Chan et al.'s parallel formula, batch by batch,
so long runs keep them exact to float64 rounding; both `update` and `__call__` are
plain TF math, safe inside tf.function and XLA (`jit_compile=True`). Update from one
place (typically the learner, on the observations it trains on); read from any.

Before the first update the statistics are mean 0, variance 1 (count 0): the
normalizer is the identity up to clipping. The first update replaces them with the
batch's (the prior has weight 0).
"""

from typing import Sequence

import sonnet as snt
import tensorflow as tf


class RunningNormalizer(snt.Module):
  """Normalizes `[..., *shape]` inputs to float32 clip((x - mean) / sqrt(var + eps)).

  Attributes (tf.Variables, non-trainable): `count` (float64 scalar, rows seen),
  `mean` and `var` (float64 `shape`; `var` is the population variance, ddof=0).
  """

  def __init__(self, shape: Sequence[int], clip: float | None = 10.0,
               epsilon: float = 1e-8, name: str = 'running_normalizer'):
    """`clip`: bound on the normalized values (None: no clipping); `epsilon` is added
    to the variance (a constant input dimension maps to 0, not to inf)."""
    super().__init__(name=name)
    self.shape = tuple(int(d) for d in shape)
    self.clip = None if clip is None else float(clip)
    self.epsilon = float(epsilon)
    self.count = tf.Variable(tf.constant(0.0, tf.float64), trainable=False, name='count')
    self.mean = tf.Variable(tf.zeros(self.shape, tf.float64), trainable=False, name='mean')
    self.var = tf.Variable(tf.ones(self.shape, tf.float64), trainable=False, name='var')

  def _check(self, x: tf.Tensor) -> None:
    """Raises unless `x`'s static shape ends in the normalized shape."""
    rank = len(self.shape)
    trailing = tuple(x.shape[x.shape.rank - rank:]) if rank else ()
    if x.shape.rank < rank or trailing != self.shape:
      raise ValueError(f'RunningNormalizer: inputs of shape {tuple(x.shape)} do not end '
                       f'in the normalized shape {self.shape}')

  def update(self, batch: tf.Tensor, mask: tf.Tensor | None = None) -> None:
    """Merges the statistics of `batch` (`[..., *shape]`) into the running ones.

    `mask` (bool or 0/1, `batch`'s leading dimensions): rows where it is false are
    left out, e.g. padding. An all-masked (or empty) batch changes nothing.
    """
    batch = tf.convert_to_tensor(batch)
    self._check(batch)
    rows = tf.reshape(tf.cast(batch, tf.float64), [-1, *self.shape])
    if mask is None:
      weight = tf.ones(tf.shape(rows)[:1], tf.float64)
    else:
      weight = tf.reshape(tf.cast(mask, tf.float64), [-1])
    weight = tf.reshape(weight, [-1] + [1] * len(self.shape))
    n_b = tf.reduce_sum(weight)
    safe_n_b = tf.maximum(n_b, 1.0)
    mean_b = tf.reduce_sum(weight * rows, axis=0) / safe_n_b
    var_b = tf.reduce_sum(weight * tf.square(rows - mean_b), axis=0) / safe_n_b
    # Chan et al. (1979): combine (n_a, mean_a, var_a) with (n_b, mean_b, var_b).
    n_a = self.count.read_value()
    mean_a, var_a = self.mean.read_value(), self.var.read_value()
    n = n_a + n_b
    safe_n = tf.maximum(n, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / safe_n)
    m2 = var_a * n_a + var_b * n_b + tf.square(delta) * (n_a * n_b / safe_n)
    seen = n_b > 0.0
    self.mean.assign(tf.where(seen, mean, mean_a))
    self.var.assign(tf.where(seen, m2 / safe_n, var_a))
    self.count.assign(n)

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """float32 normalized `x` (`[..., *shape]`, any leading dimensions)."""
    x = tf.convert_to_tensor(x)
    self._check(x)
    inv_std = tf.cast(tf.math.rsqrt(self.var + self.epsilon), tf.float32)
    y = (tf.cast(x, tf.float32) - tf.cast(self.mean, tf.float32)) * inv_std
    if self.clip is not None:
      y = tf.clip_by_value(y, -self.clip, self.clip)
    return y
