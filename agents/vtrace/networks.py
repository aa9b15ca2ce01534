"""Policy/value networks for V-trace (Sonnet 2).

Every network has the same three entry points:

* `initial_state(batch_size)` -> recurrent state (`()` for feed-forward nets);
* `__call__(observation, state)` -> `((logits, value), next_state)`, one step for a
  batch of envs (the inference server's call);
* `unroll(observations, first, state)` -> `(logits, values)` over time-major
  `[T, B, ...]` inputs, resetting the state wherever `first` is set (the learner's call).

Observations arrive in the env's dtype; uint8 frames are scaled to [0, 1] here, on the
device, so they cross the network as bytes.
"""

from typing import Any, Sequence, Tuple

import sonnet as snt
import tensorflow as tf

Nest = Any


def _to_float(observation: tf.Tensor) -> tf.Tensor:
  if observation.dtype == tf.uint8:
    return tf.cast(observation, tf.float32) / 255.0
  return tf.cast(observation, tf.float32)


class MLPTorso(snt.Module):
  """Flatten + ReLU MLP."""

  def __init__(self, hidden_sizes: Sequence[int], name: str = 'mlp_torso'):
    super().__init__(name=name)
    self._mlp = snt.nets.MLP(list(hidden_sizes), activate_final=True)

  def __call__(self, observation: tf.Tensor) -> tf.Tensor:
    return self._mlp(snt.Flatten()(_to_float(observation)))


class PolicyValueHead(snt.Module):
  """Linear policy logits and a scalar value."""

  def __init__(self, num_actions: int, name: str = 'policy_value_head'):
    super().__init__(name=name)
    self._policy = snt.Linear(num_actions, name='policy')
    self._value = snt.Linear(1, name='value')

  def __call__(self, features: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    return self._policy(features), tf.squeeze(self._value(features), axis=-1)


class FeedForwardPolicyValue(snt.Module):
  """MLP torso -> (logits, value). Stateless."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64, 64),
               name: str = 'feed_forward_policy_value'):
    super().__init__(name=name)
    self._torso = MLPTorso(hidden_sizes)
    self._head = PolicyValueHead(num_actions)

  def initial_state(self, batch_size: int) -> Nest:
    del batch_size
    return ()

  def __call__(self, observation, state=()):
    return self._head(self._torso(observation)), state

  def unroll(self, observations, first, state=()):
    del first, state
    t, b = tf.shape(observations)[0], tf.shape(observations)[1]
    flat = tf.reshape(observations, tf.concat([[t * b], tf.shape(observations)[2:]], 0))
    logits, values = self._head(self._torso(flat))
    return (tf.reshape(logits, [t, b, -1]), tf.reshape(values, [t, b]))


class LSTMPolicyValue(snt.Module):
  """MLP torso -> LSTM -> (logits, value). State is the tuple (hidden, cell)."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64,),
               lstm_size: int = 64, name: str = 'lstm_policy_value'):
    super().__init__(name=name)
    self._torso = MLPTorso(hidden_sizes)
    self._core = snt.LSTM(lstm_size)
    self._head = PolicyValueHead(num_actions)
    self._lstm_size = lstm_size

  def initial_state(self, batch_size: int) -> Nest:
    zeros = tf.zeros([batch_size, self._lstm_size], tf.float32)
    return (zeros, zeros)

  def __call__(self, observation, state):
    out, next_state = self._core(self._torso(observation), snt.LSTMState(*state))
    return self._head(out), (next_state.hidden, next_state.cell)

  def unroll(self, observations, first, state):
    t_max = observations.shape[0]
    features = tf.unstack(self._torso_time_major(observations), num=t_max)
    firsts = tf.unstack(first, num=t_max)
    initial = self.initial_state(tf.shape(first)[1])
    hidden, cell = state
    outputs = []
    for t in range(t_max):
      reset = firsts[t][:, None]
      hidden = tf.where(reset, initial[0], hidden)
      cell = tf.where(reset, initial[1], cell)
      out, s = self._core(features[t], snt.LSTMState(hidden, cell))
      hidden, cell = s.hidden, s.cell
      outputs.append(out)
    stacked = tf.stack(outputs)  # [T, B, H]
    t, b = tf.shape(stacked)[0], tf.shape(stacked)[1]
    logits, values = self._head(tf.reshape(stacked, [t * b, self._lstm_size]))
    return tf.reshape(logits, [t, b, -1]), tf.reshape(values, [t, b])

  def _torso_time_major(self, observations):
    t, b = tf.shape(observations)[0], tf.shape(observations)[1]
    flat = tf.reshape(observations, tf.concat([[t * b], tf.shape(observations)[2:]], 0))
    features = self._torso(flat)
    return tf.reshape(features, [t, b, features.shape[-1]])


def make_network(kind: str, num_actions: int, hidden_sizes: Sequence[int],
                 lstm_size: int) -> snt.Module:
  """'mlp' or 'lstm' policy/value network."""
  if kind == 'mlp':
    return FeedForwardPolicyValue(num_actions, hidden_sizes)
  if kind == 'lstm':
    return LSTMPolicyValue(num_actions, hidden_sizes, lstm_size)
  raise ValueError(f"Unknown network {kind!r}; choose 'mlp' or 'lstm'")
