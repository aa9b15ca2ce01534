"""R2D2's recurrent Q-network (Sonnet 2): MLP torso -> LSTM -> (dueling) Q head.

Entry points match the V-trace networks: `initial_state`, `__call__(obs, state)` for
one batched inference step, and `unroll(obs, first, state)` over time-major inputs,
which here also returns the final state (the learner's burn-in needs it).
"""

from typing import Any, Sequence, Tuple

import sonnet as snt
import tensorflow as tf

from seedacme.agents.vtrace.networks import MLPTorso

Nest = Any


class DuelingHead(snt.Module):
  """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a)."""

  def __init__(self, num_actions: int, name: str = 'dueling_head'):
    super().__init__(name=name)
    self._value = snt.Linear(1, name='value')
    self._advantage = snt.Linear(num_actions, name='advantage')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    advantage = self._advantage(x)
    return self._value(x) + advantage - tf.reduce_mean(advantage, axis=-1, keepdims=True)


class RecurrentQNetwork(snt.Module):
  """MLP torso -> LSTM -> Q-values; state is the tuple (hidden, cell)."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64,),
               lstm_size: int = 128, dueling: bool = True, name: str = 'r2d2_q_network'):
    super().__init__(name=name)
    self._torso = MLPTorso(hidden_sizes)
    self._core = snt.LSTM(lstm_size)
    self._head = DuelingHead(num_actions) if dueling else snt.Linear(num_actions, name='q')
    self._lstm_size = lstm_size

  def initial_state(self, batch_size: int) -> Nest:
    zeros = tf.zeros([batch_size, self._lstm_size], tf.float32)
    return (zeros, zeros)

  def __call__(self, observation, state):
    out, next_state = self._core(self._torso(observation), snt.LSTMState(*state))
    return self._head(out), (next_state.hidden, next_state.cell)

  def unroll(self, observations, first, state) -> Tuple[tf.Tensor, Nest]:
    """Q-values `[T, B, A]` and the state after the last step."""
    t_max = observations.shape[0]
    t, b = tf.shape(observations)[0], tf.shape(observations)[1]
    flat = tf.reshape(observations, tf.concat([[t * b], tf.shape(observations)[2:]], 0))
    features = self._torso(flat)
    features = tf.unstack(tf.reshape(features, [t, b, features.shape[-1]]), num=t_max)
    firsts = tf.unstack(first, num=t_max)
    zeros = tf.zeros_like(state[0])
    hidden, cell = state
    outputs = []
    for step in range(t_max):
      reset = firsts[step][:, None]
      hidden = tf.where(reset, zeros, hidden)
      cell = tf.where(reset, zeros, cell)
      out, s = self._core(features[step], snt.LSTMState(hidden, cell))
      hidden, cell = s.hidden, s.cell
      outputs.append(out)
    stacked = tf.reshape(tf.stack(outputs), [t * b, self._lstm_size])
    q = self._head(stacked)
    return tf.reshape(q, [t, b, -1]), (hidden, cell)
