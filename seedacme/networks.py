"""Network building blocks shared by agents (Sonnet 2).

Agents' networks have the same entry points: `initial_state(batch_size)`,
`__call__(observation, state)` for one batched inference step on the server, and
`unroll(observations, first, state)` over time-major `[T, B, ...]` inputs for the
learner. `RecurrentCore` is the part they share: a torso, then an LSTM whose state is
reset wherever an episode starts.
"""

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import sonnet as snt
import tensorflow as tf
from seedacme.types import Nest



def to_float(observation: tf.Tensor) -> tf.Tensor:
  """uint8 frames to [0, 1] on the device (they cross the network as bytes)."""
  if observation.dtype == tf.uint8:
    return tf.cast(observation, tf.float32) / 255.0
  return tf.cast(observation, tf.float32)


def batch_apply(fn: Callable[[tf.Tensor], Any], x: tf.Tensor) -> Any:
  """Applies `fn` to `[T, B, ...]` as one `[T * B, ...]` batch; restores `[T, B, ...]`."""
  t, b = tf.shape(x)[0], tf.shape(x)[1]
  out = fn(tf.reshape(x, tf.concat([[t * b], tf.shape(x)[2:]], 0)))
  return tf.nest.map_structure(
      lambda y: tf.reshape(y, tf.concat([[t, b], tf.shape(y)[1:]], 0)), out)


class MLPTorso(snt.Module):
  """Flatten + ReLU MLP."""

  def __init__(self, hidden_sizes: Sequence[int], name: str = 'mlp_torso'):
    super().__init__(name=name)
    self._mlp = snt.nets.MLP(list(hidden_sizes), activate_final=True)

  def __call__(self, observation: tf.Tensor) -> tf.Tensor:
    return self._mlp(snt.Flatten()(to_float(observation)))


class RecurrentCore(snt.Module):
  """Torso -> LSTM. State is the tuple (hidden, cell); zeros at an episode's start."""

  def __init__(self, torso: snt.Module, lstm_size: int, name: str = 'recurrent_core'):
    super().__init__(name=name)
    self._torso = torso
    self._lstm = snt.LSTM(lstm_size)
    self.size = lstm_size

  def initial_state(self, batch_size) -> Nest:
    zeros = tf.zeros([batch_size, self.size], tf.float32)
    return (zeros, zeros)

  def __call__(self, observation, state) -> Tuple[tf.Tensor, Nest]:
    out, next_state = self._lstm(self._torso(observation), snt.LSTMState(*state))
    return out, (next_state.hidden, next_state.cell)

  def unroll(self, observations, first, state) -> Tuple[tf.Tensor, Nest]:
    """Core outputs `[T, B, size]` and the state after the last step.

    The state is reset to zeros before every step whose `first` is set, so an unroll
    may cross episode boundaries.
    """
    t_max = observations.shape[0]
    features = tf.unstack(batch_apply(self._torso, observations), num=t_max)
    firsts = tf.unstack(first, num=t_max)
    hidden, cell = state
    zeros = tf.zeros_like(hidden)
    outputs = []
    for t in range(t_max):
      reset = firsts[t][:, None]
      hidden, cell = tf.where(reset, zeros, hidden), tf.where(reset, zeros, cell)
      out, s = self._lstm(features[t], snt.LSTMState(hidden, cell))
      hidden, cell = s.hidden, s.cell
      outputs.append(out)
    return tf.stack(outputs), (hidden, cell)


class Conv2D(snt.Module):
  """2-D convolution, NHWC. (Sonnet 2.0.0's `snt.Conv2D` calls `collections.Sequence`,
  which Python 3.10 removed.)"""

  def __init__(self, channels: int, kernel: int, stride: int = 1, padding: str = 'SAME',
               w_init: snt.initializers.Initializer | None = None, name: str = 'conv2d'):
    """`w_init` defaults to a truncated normal with stddev 1/sqrt(fan_in)."""
    super().__init__(name=name)
    self._channels, self._kernel, self._stride, self._padding = (channels, kernel, stride,
                                                                 padding)
    self._w_init = w_init

  @snt.once
  def _create(self, in_channels: int) -> None:
    fan_in = self._kernel * self._kernel * in_channels
    init = self._w_init or snt.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(fan_in))
    self.w = tf.Variable(init([self._kernel, self._kernel, in_channels, self._channels],
                              tf.float32), name='w')
    self.b = tf.Variable(tf.zeros([self._channels]), name='b')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    self._create(x.shape[-1])
    return tf.nn.conv2d(x, self.w, self._stride, self._padding) + self.b


class NatureCNN(snt.Module):
  """DQN's torso (Mnih et al., 2015): 3 conv layers, then a 512-unit ReLU layer.

  Weights are orthogonal with gain sqrt(2) (He-style, as in the A2C/PPO Atari
  baselines), not fan-in scaled: Atari frames are a near-constant background with a few
  moving pixels, and with fan-in init the features hardly differed between frames (the
  value's spread over Pong frames was 10x smaller), so the learner's early pull of the
  value towards the mean return drove units dead instead of telling frames apart
  (tests/unit/test_atari_vtrace_torso.py).
  """

  def __init__(self, name: str = 'nature_cnn'):
    super().__init__(name=name)
    ortho = snt.initializers.Orthogonal(gain=np.sqrt(2.0))
    self._convs = [Conv2D(32, 8, stride=4, padding='VALID', w_init=ortho),
                   Conv2D(64, 4, stride=2, padding='VALID', w_init=ortho),
                   Conv2D(64, 3, stride=1, padding='VALID', w_init=ortho)]
    self._linear = snt.Linear(512, w_init=ortho)

  @property
  def convs(self) -> list:
    return list(self._convs)

  def __call__(self, observation: tf.Tensor) -> tf.Tensor:
    x = to_float(observation)
    for conv in self._convs:
      x = tf.nn.relu(conv(x))
    return tf.nn.relu(self._linear(snt.Flatten()(x)))


class _ResidualBlock(snt.Module):

  def __init__(self, channels: int, name: str = 'residual_block'):
    super().__init__(name=name)
    self._conv0 = Conv2D(channels, 3, padding='SAME')
    self._conv1 = Conv2D(channels, 3, padding='SAME')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    return x + self._conv1(tf.nn.relu(self._conv0(tf.nn.relu(x))))


class ImpalaResNet(snt.Module):
  """IMPALA's deep torso (SEED's Atari/DMLab network): 3 stacks of conv + max-pool +
  2 residual blocks with [16, 32, 32] channels, then a 256-unit ReLU layer."""

  def __init__(self, channels: Sequence[int] = (16, 32, 32), name: str = 'impala_resnet'):
    super().__init__(name=name)
    self._stacks = [(Conv2D(c, 3, padding='SAME'), _ResidualBlock(c), _ResidualBlock(c))
                    for c in channels]
    self._linear = snt.Linear(256)

  def __call__(self, observation: tf.Tensor) -> tf.Tensor:
    x = to_float(observation)
    for conv, block0, block1 in self._stacks:
      x = tf.nn.max_pool2d(conv(x), ksize=3, strides=2, padding='SAME')
      x = block1(block0(x))
    return tf.nn.relu(self._linear(snt.Flatten()(tf.nn.relu(x))))


# SEED's Google Research Football torso: the IMPALA ResNet with a fourth stack, on the
# stacked Super Mini Map ([72, 96, 16] -> 5 x 6 x 32 -> 256).
FOOTBALL_CHANNELS = (16, 32, 32, 32)

TORSOS = ('mlp', 'nature_cnn', 'impala_resnet', 'football')


def make_torso(kind: str, hidden_sizes: Sequence[int] = (64,)) -> snt.Module:
  """'mlp' (flatten + MLP), 'nature_cnn', 'impala_resnet' or 'football' (SEED's
  4-stack ResNet for the football SMM) (frames `[H, W, C]`)."""
  if kind == 'mlp':
    return MLPTorso(hidden_sizes)
  if kind == 'nature_cnn':
    return NatureCNN()
  if kind == 'impala_resnet':
    return ImpalaResNet()
  if kind == 'football':
    return ImpalaResNet(FOOTBALL_CHANNELS, name='football_resnet')
  raise ValueError(f'Unknown torso {kind!r}; choose one of {", ".join(TORSOS)}')
