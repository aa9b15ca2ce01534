"""R2D2's recurrent Q-network (Sonnet 2): torso -> LSTM core -> (dueling) Q head.

Entry points match the V-trace networks: `initial_state`, `__call__(obs, state)` for
one batched inference step, and `unroll(obs, first, state)` over time-major inputs,
which here also returns the final state (the learner's burn-in needs it).
"""

from typing import Sequence, Tuple

import sonnet as snt
import tensorflow as tf

from seedacme.networks import RecurrentCore, batch_apply, make_torso
from seedacme.types import Nest



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
  """Torso -> LSTM core -> Q-values; state is the tuple (hidden, cell)."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64,),
               lstm_size: int = 128, dueling: bool = True, torso: str = 'mlp',
               name: str = 'r2d2_q_network'):
    super().__init__(name=name)
    self._core = RecurrentCore(make_torso(torso, hidden_sizes), lstm_size)
    self._head = DuelingHead(num_actions) if dueling else snt.Linear(num_actions, name='q')

  def initial_state(self, batch_size: int) -> Nest:
    return self._core.initial_state(batch_size)

  def __call__(self, observation, state):
    out, next_state = self._core(observation, state)
    return self._head(out), next_state

  def unroll(self, observations, first, state) -> Tuple[tf.Tensor, Nest]:
    """Q-values `[T, B, A]` and the state after the last step."""
    outputs, final_state = self._core.unroll(observations, first, state)
    return batch_apply(self._head, outputs), final_state
