"""Policy/value networks for V-trace (Sonnet 2).

Every network has the same three entry points:

* `initial_state(batch_size)` -> recurrent state (`()` for feed-forward nets);
* `__call__(observation, state)` -> `((logits, value), next_state)`, one step for a
  batch of envs (the inference server's call);
* `unroll(observations, first, state)` -> `(logits, values)` over time-major
  `[T, B, ...]` inputs, resetting the state wherever `first` is set (the learner's call).

Observations arrive in the env's dtype; uint8 frames are scaled to [0, 1] here, on the
device, so they cross the network as bytes.

Discrete actions get logits (`policy` is a Linear). Continuous actions get one of the
shared action heads of `seedacme.distributions` (`action_head`), and the policy output
is that head's parameters instead of logits; an optional `RunningNormalizer` normalizes
vector observations (its statistics are variables of the network).
"""

from typing import Sequence, Tuple

import sonnet as snt
import tensorflow as tf

from seedacme.networks import RecurrentCore, batch_apply, make_torso, to_float
from seedacme.types import Nest



def _policy_init_scale(torso: str) -> float | None:
  """A small policy init for the Nature CNN, whose orthogonal sqrt(2) features are large."""
  return 0.01 if torso == 'nature_cnn' else None


class PolicyValueHead(snt.Module):
  """Linear policy logits and a scalar value.

  `policy_init_scale`: if set, the policy weights are orthogonal with this gain (0.01:
  a near-uniform first policy however large the torso's features, as for frames).
  """

  def __init__(self, num_actions: int, policy_init_scale: float | None = None,
               action_head: snt.Module | None = None, name: str = 'policy_value_head'):
    super().__init__(name=name)
    w_init = (None if policy_init_scale is None
              else snt.initializers.Orthogonal(gain=policy_init_scale))
    self._policy = action_head or snt.Linear(num_actions, w_init=w_init, name='policy')
    self._value = snt.Linear(1, name='value')

  def __call__(self, features: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    return self._policy(features), tf.squeeze(self._value(features), axis=-1)


class FeedForwardPolicyValue(snt.Module):
  """Torso -> (logits, value): the feed-forward core. Stateless."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64, 64),
               torso: str = 'mlp', action_head: snt.Module | None = None,
               normalizer: snt.Module | None = None,
               name: str = 'feed_forward_policy_value'):
    super().__init__(name=name)
    self.action_head, self.normalizer = action_head, normalizer
    self._torso = make_torso(torso, hidden_sizes)
    self._reader = _normalized(self._torso, normalizer)
    self._head = PolicyValueHead(num_actions, _policy_init_scale(torso), action_head)

  @property
  def torso(self) -> snt.Module:
    return self._torso

  def initial_state(self, batch_size: int) -> Nest:
    del batch_size
    return ()

  def __call__(self, observation, state=()):
    return self._head(self._reader(observation)), state

  def unroll(self, observations, first, state=()):
    del first, state
    return batch_apply(lambda x: self._head(self._reader(x)), observations)


class LSTMPolicyValue(snt.Module):
  """Torso -> LSTM core -> (logits, value). State is the tuple (hidden, cell)."""

  def __init__(self, num_actions: int, hidden_sizes: Sequence[int] = (64,),
               lstm_size: int = 64, torso: str = 'mlp',
               action_head: snt.Module | None = None,
               normalizer: snt.Module | None = None, name: str = 'lstm_policy_value'):
    super().__init__(name=name)
    self.action_head, self.normalizer = action_head, normalizer
    self._core = RecurrentCore(_normalized(make_torso(torso, hidden_sizes), normalizer),
                               lstm_size)
    self._head = PolicyValueHead(num_actions, _policy_init_scale(torso), action_head)

  def initial_state(self, batch_size: int) -> Nest:
    return self._core.initial_state(batch_size)

  def __call__(self, observation, state):
    out, next_state = self._core(observation, state)
    return self._head(out), next_state

  def unroll(self, observations, first, state):
    outputs, _ = self._core.unroll(observations, first, state)
    return batch_apply(self._head, outputs)


def _normalized(torso: snt.Module, normalizer: snt.Module | None) -> snt.Module:
  return torso if normalizer is None else _Normalized(torso, normalizer)


class _Normalized(snt.Module):
  """The torso, reading observations through the running normalizer if there is one."""

  def __init__(self, torso: snt.Module, normalizer: snt.Module | None):
    super().__init__(name='normalized_torso')
    self._torso, self._normalizer = torso, normalizer

  def __call__(self, observation):
    return self._torso(self._normalizer(to_float(observation)))


def make_network(core: str, num_actions: int, hidden_sizes: Sequence[int],
                 lstm_size: int, torso: str = 'mlp', action_head: snt.Module | None = None,
                 normalizer: snt.Module | None = None) -> snt.Module:
  """The policy/value network: `torso` -> `core` ('feedforward' or 'lstm') -> head
  (logits over `num_actions`, or `action_head`'s parameters)."""
  if core == 'feedforward':
    return FeedForwardPolicyValue(num_actions, hidden_sizes, torso, action_head, normalizer)
  if core == 'lstm':
    return LSTMPolicyValue(num_actions, hidden_sizes, lstm_size, torso, action_head,
                           normalizer)
  raise ValueError(f"Unknown core {core!r}; choose 'feedforward' or 'lstm'")
