"""Network building blocks shared by agents (Sonnet 2).

Agents' networks have the same entry points: `initial_state(batch_size)`,
`__call__(observation, state)` for one batched inference step on the server, and
`unroll(observations, first, state)` over time-major `[T, B, ...]` inputs for the
learner. `RecurrentCore` is the part they share: a torso, then an LSTM whose state is
reset wherever an episode starts.
"""

from typing import Any, Callable, Sequence, Tuple

import sonnet as snt
import tensorflow as tf

Nest = Any


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
