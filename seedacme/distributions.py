"""Action heads shared by agents: features -> a distribution over the env's actions.

One interface for discrete and continuous action spaces, so an agent (PPO, V-trace,
SAC) writes its policy loss once against `ActionHead` and `make_action_head(spec)`
picks the head for the env. A head splits an action into two forms:

* `raw`: what the policy sampled and what trajectories store; `log_prob(params, raw)`
  is exact on it. For a Normal head it is the pre-squash sample `u`, so the learner
  never inverts tanh (atanh of an action at a bound is infinite).
* `to_env(raw)`: what the env takes (int32 index, or a float32 action inside bounds).

Everything is plain TF math with the sampling generator passed in, because heads run
inside the server's compiled batch step (XLA-compiled where `use_xla` says) and inside the
learner's tf.function: no TF Probability, no data-dependent shapes. Methods take any
leading dimensions (`[N, ...]` on the server, `[T, B, ...]` in the learner).
"""

import math
from typing import Dict, Tuple

import numpy as np
import sonnet as snt
import tensorflow as tf

from seedacme.types import EnvSpec

Params = Dict[str, tf.Tensor]
SQUASHES = ('tanh', 'clip')
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class ActionHead(snt.Module):
  """Base: a distribution head. Subclasses implement every method below."""

  raw_spec: tf.TensorSpec  # shape/dtype of `raw` for one env (for Reverb signatures)
  params_spec: Dict[str, tf.TensorSpec]  # the same for each entry of `params`
  action_spec: tf.TensorSpec  # what `to_env` gives for one env

  def __call__(self, features: tf.Tensor) -> Params:
    """Distribution parameters from `[..., F]` features (a dict of `[..., *]` tensors)."""
    raise NotImplementedError

  def sample(self, params: Params, rng: tf.random.Generator) -> tf.Tensor:
    """A `raw` sample per row, drawn with `rng` (reproducible given its seed)."""
    raise NotImplementedError

  def mode(self, params: Params) -> tf.Tensor:
    """The greedy `raw` action (argmax, or the mean)."""
    raise NotImplementedError

  def log_prob(self, params: Params, raw: tf.Tensor) -> tf.Tensor:
    """Log-probability (or density) of `raw`, `[...]`."""
    raise NotImplementedError

  def entropy(self, params: Params) -> tf.Tensor:
    """Entropy per row, `[...]` (see each head for exact vs estimated)."""
    raise NotImplementedError

  def to_env(self, raw: tf.Tensor) -> tf.Tensor:
    """The action the env takes for `raw`."""
    raise NotImplementedError


class CategoricalHead(ActionHead):
  """Logits from a Linear layer; `raw` is the int32 action index.

  `init_scale`: if set, the weights are orthogonal with this gain (0.01: a
  near-uniform first policy however large the torso's features).
  """

  def __init__(self, num_actions: int, init_scale: float | None = None,
               name: str = 'categorical_head'):
    super().__init__(name=name)
    if num_actions < 1:
      raise ValueError(f'CategoricalHead needs num_actions >= 1, got {num_actions}')
    self.num_actions = int(num_actions)
    w_init = None if init_scale is None else snt.initializers.Orthogonal(gain=init_scale)
    self._linear = snt.Linear(self.num_actions, w_init=w_init, name='logits')
    self.raw_spec = tf.TensorSpec([], tf.int32)
    self.action_spec = self.raw_spec
    self.params_spec = {'logits': tf.TensorSpec([self.num_actions], tf.float32)}

  def __call__(self, features: tf.Tensor) -> Params:
    return {'logits': self._linear(features)}

  def sample(self, params: Params, rng: tf.random.Generator) -> tf.Tensor:
    # Gumbel-max: argmax(logits + Gumbel noise) is an exact categorical sample.
    logits = params['logits']
    u = rng.uniform(tf.shape(logits), minval=1e-20, maxval=1.0)
    return tf.argmax(logits - tf.math.log(-tf.math.log(u)), axis=-1, output_type=tf.int32)

  def mode(self, params: Params) -> tf.Tensor:
    return tf.argmax(params['logits'], axis=-1, output_type=tf.int32)

  def log_prob(self, params: Params, raw: tf.Tensor) -> tf.Tensor:
    return -tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(raw, tf.int32), logits=params['logits'])

  def entropy(self, params: Params) -> tf.Tensor:
    log_p = tf.nn.log_softmax(params['logits'])
    return -tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1)

  def to_env(self, raw: tf.Tensor) -> tf.Tensor:
    return tf.cast(raw, tf.int32)


def _float32_bounds(spec: EnvSpec) -> Tuple[np.ndarray, np.ndarray]:
  """The spec's bounds as float32, rounded inward: a float32 action clipped to them is
  inside the float64 bounds that `EnvSpec.check_actions` compares with."""
  low64 = np.asarray(spec.action_minimum, np.float64)
  high64 = np.asarray(spec.action_maximum, np.float64)
  low, high = low64.astype(np.float32), high64.astype(np.float32)
  low = np.where(low < low64, np.nextafter(low, np.float32(np.inf)), low)
  high = np.where(high > high64, np.nextafter(high, np.float32(-np.inf)), high)
  return low.astype(np.float32), high.astype(np.float32)


class NormalHead(ActionHead):
  """A diagonal Normal over `u` in [-1, 1] units, squashed onto the env's bounds.

  The mean is a Linear layer (orthogonal init, gain `mean_init_scale`); the log-std
  is a trainable vector `log_std` [A], independent of the state (PPO's usual choice),
  clipped to `log_std_range` where used. Actions of any shape are flattened to
  A = prod(action_shape) and reshaped back by `to_env`. `raw` is the Normal sample
  `u`, float32 [..., A].

  squash='tanh' (SAC's): action = low + (tanh(u) + 1) / 2 * (high - low). `log_prob`
    is the exact log-density of that env action: the Normal's, minus
    log(1 - tanh(u)^2) per dimension (computed as 2 (log 2 - u - softplus(-2u))), minus
    the constant `affine_log_det` = sum log((high - low) / 2). (SAC's target entropy
    -A is in [-1, 1] units: add `affine_log_det` to a log-prob to get them.)
    `entropy` has no closed form; it is estimated at the mode: the Normal's entropy
    plus E[log |d action / d u|] evaluated at u = mean. log(1 - tanh^2) is concave,
    so by Jensen this is an upper bound on the true entropy, tight as std -> 0; it is
    deterministic and differentiable in both mean and log-std.
  squash='clip' (CleanRL's PPO): action = clip(the affine map of u from [-1, 1] onto
    the bounds). `log_prob` and `entropy` are the plain Normal's over `u` (clipping
    puts mass on the bounds, so the env action has no density of its own).

  `to_env` clips to the bounds in float32, rounded inward, so rounding can never put
  an action outside them.
  """

  def __init__(self, spec: EnvSpec, squash: str = 'tanh', init_log_std: float = 0.0,
               mean_init_scale: float = 0.01,
               log_std_range: Tuple[float, float] = (-20.0, 2.0),
               state_dependent_std: bool = False, name: str = 'normal_head'):
    super().__init__(name=name)
    if not spec.continuous:
      raise ValueError(f'NormalHead needs continuous actions; the env takes '
                       f'{spec.describe_actions()} ({spec})')
    if squash not in SQUASHES:
      raise ValueError(f'Unknown squash {squash!r}; choose one of {", ".join(SQUASHES)}')
    self.squash = squash
    self.action_shape = tuple(int(d) for d in spec.action_shape)
    self.size = size = int(np.prod(self.action_shape))
    self.log_std_range = (float(log_std_range[0]), float(log_std_range[1]))
    self._mean = snt.Linear(size, w_init=snt.initializers.Orthogonal(gain=mean_init_scale),
                            name='mean')
    # SAC's std depends on the state (a second Linear, squashed into `log_std_range`);
    # PPO's is one trainable vector.
    self._log_std_layer = snt.Linear(size, name='log_std') if state_dependent_std else None
    self.log_std = None if state_dependent_std else tf.Variable(
        tf.fill([size], tf.constant(init_log_std, tf.float32)), trainable=True,
        name='log_std')
    low, high = _float32_bounds(spec)
    self._low, self._high = tf.constant(low), tf.constant(high)
    span = (np.asarray(spec.action_maximum, np.float64) -
            np.asarray(spec.action_minimum, np.float64))
    self._half_span = tf.constant(span / 2.0, tf.float32)
    self._center = tf.constant((np.asarray(spec.action_maximum, np.float64) +
                                np.asarray(spec.action_minimum, np.float64)) / 2.0,
                               tf.float32)
    self.affine_log_det = float(np.sum(np.log(span / 2.0)))
    self.raw_spec = tf.TensorSpec([size], tf.float32)
    self.action_spec = tf.TensorSpec(self.action_shape, tf.float32)
    self.params_spec = {'mean': self.raw_spec, 'log_std': self.raw_spec}

  def __call__(self, features: tf.Tensor) -> Params:
    mean = self._mean(features)
    low, high = self.log_std_range
    if self._log_std_layer is not None:
      squashed = tf.tanh(self._log_std_layer(features))
      return {'mean': mean, 'log_std': low + 0.5 * (high - low) * (squashed + 1.0)}
    log_std = tf.clip_by_value(self.log_std, low, high)
    return {'mean': mean, 'log_std': tf.zeros_like(mean) + log_std}

  def sample(self, params: Params, rng: tf.random.Generator) -> tf.Tensor:
    mean = params['mean']
    return mean + tf.exp(params['log_std']) * rng.normal(tf.shape(mean), dtype=mean.dtype)

  def mode(self, params: Params) -> tf.Tensor:
    return params['mean']

  def _normal_log_prob(self, params: Params, u: tf.Tensor) -> tf.Tensor:
    z = (u - params['mean']) * tf.exp(-params['log_std'])
    return tf.reduce_sum(-0.5 * tf.square(z) - params['log_std'] - _HALF_LOG_2PI, axis=-1)

  def _log_det(self, u: tf.Tensor) -> tf.Tensor:
    """log |d action / d u| summed over dimensions (tanh only)."""
    log_dtanh = 2.0 * (math.log(2.0) - u - tf.nn.softplus(-2.0 * u))
    return tf.reduce_sum(log_dtanh, axis=-1) + self.affine_log_det

  def log_prob(self, params: Params, raw: tf.Tensor) -> tf.Tensor:
    raw = tf.cast(raw, tf.float32)
    log_p = self._normal_log_prob(params, raw)
    return log_p - self._log_det(raw) if self.squash == 'tanh' else log_p

  def entropy(self, params: Params) -> tf.Tensor:
    normal = tf.reduce_sum(params['log_std'] + 0.5 + _HALF_LOG_2PI, axis=-1)
    if self.squash == 'tanh':
      return normal + self._log_det(params['mean'])
    return normal

  def to_env(self, raw: tf.Tensor) -> tf.Tensor:
    raw = tf.cast(raw, tf.float32)
    y = tf.tanh(raw) if self.squash == 'tanh' else raw
    action = tf.clip_by_value(self._center + y * self._half_span, self._low, self._high)
    return tf.reshape(action, tf.concat([tf.shape(action)[:-1], self.action_shape], 0))


def make_action_head(spec: EnvSpec, squash: str = 'tanh', **kwargs) -> ActionHead:
  """The head for `spec`'s actions: `CategoricalHead` for discrete, `NormalHead` for
  continuous (with `squash`). `kwargs` go to that head's constructor."""
  continuous = getattr(spec, 'continuous', None)
  if continuous is None or (not continuous and getattr(spec, 'num_actions', 0) < 1):
    raise ValueError(f'make_action_head: no action head for {spec!r}')
  head_cls = NormalHead if continuous else CategoricalHead
  try:
    if continuous:
      return NormalHead(spec, squash=squash, **kwargs)
    return CategoricalHead(spec.num_actions, **kwargs)
  except TypeError as e:
    raise ValueError(f'make_action_head: {spec.describe_actions()} ({spec}) builds a '
                     f'{head_cls.__name__}, which cannot take {sorted(kwargs)}: {e}') from e
