"""PPO's policy/value network: (normalized) observation -> torso(s) -> action head, value.

Same entry points as every agent's network (seedacme/networks.py): `initial_state`,
`__call__(observation, state)` for the server's batch step, `unroll(observations,
first, state)` for the learner. The action head is the shared one of
`seedacme.distributions` (categorical, or a tanh-squashed / clipped Normal mapped onto
the env's bounds), so PPO serves discrete and continuous actions alike.

Vector observations get separate tanh MLPs for policy and value with orthogonal init
(sqrt(2) hidden, 0.01 policy, 1.0 value): "What Matters in On-Policy RL" found
separate networks and tanh best on MuJoCo, and CleanRL's PPO is built so. Frames share
one CNN torso. The observation normalizer is a submodule, so its statistics are part of
`variables` (what actor-side inference copies), of the checkpoint and of the export.
"""

from typing import Tuple

import numpy as np
import sonnet as snt
import tensorflow as tf

from seedacme.agents.ppo.config import PPOConfig
from seedacme.distributions import make_action_head
from seedacme.networks import RecurrentCore, batch_apply, make_torso, to_float
from seedacme.normalization import RunningNormalizer
from seedacme.types import EnvSpec, Nest


def _mlp(hidden_sizes, activation: str, name: str) -> snt.Module:
  act = tf.tanh if activation == 'tanh' else tf.nn.relu
  return snt.nets.MLP(list(hidden_sizes), activation=act, activate_final=True,
                      w_init=snt.initializers.Orthogonal(gain=np.sqrt(2.0)), name=name)


class _Torso(snt.Module):
  """Flatten + MLP, or a frame torso (`seedacme.networks.make_torso`)."""

  def __init__(self, config: PPOConfig, name: str, hidden_sizes=None):
    super().__init__(name=name)
    sizes = config.hidden_sizes if hidden_sizes is None else hidden_sizes
    self._mlp = (_mlp(sizes, config.activation, name + '_mlp')
                 if config.torso == 'mlp' else None)
    self._frames = make_torso(config.torso) if self._mlp is None else None

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    if self._mlp is not None:
      return self._mlp(snt.Flatten()(x))
    return self._frames(x)


class PPONetwork(snt.Module):
  """Policy (an action head's parameters) and value, optionally recurrent."""

  def __init__(self, spec: EnvSpec, config: PPOConfig, name: str = 'ppo_network'):
    super().__init__(name=name)
    self._config = config
    self.normalizer = (RunningNormalizer(spec.observation_shape,
                                         clip=config.observation_clip)
                       if config.normalize_observations else None)
    head_kwargs = (dict(init_log_std=config.init_log_std) if spec.continuous
                   else dict(init_scale=0.01))
    self.head = make_action_head(spec, squash=config.squash, **head_kwargs)
    self._value = snt.Linear(1, w_init=snt.initializers.Orthogonal(gain=1.0), name='value')
    self._policy_torso = _Torso(config, 'policy_torso')
    self._value_torso = (_Torso(config, 'value_torso', config.value_hidden_sizes)
                         if config.separate_value_torso else None)
    self._core = (RecurrentCore(self._policy_torso, config.lstm_size)
                  if config.core == 'lstm' else None)
    # The learner step these weights come from: the learner sets it, the policy stamps
    # it on every served step (the policy lag, measured).
    self.version = tf.Variable(0, dtype=tf.int32, trainable=False, name='policy_version')

  def _inputs(self, observation: tf.Tensor) -> tf.Tensor:
    x = to_float(observation)
    return self.normalizer(x) if self.normalizer is not None else x

  def _heads(self, policy_features, value_features):
    value = tf.squeeze(self._value(value_features), axis=-1)
    return self.head(policy_features), value

  def _feed_forward(self, x):
    features = self._policy_torso(x)
    value_features = features if self._value_torso is None else self._value_torso(x)
    return self._heads(features, value_features)

  def initial_state(self, batch_size: int) -> Nest:
    return self._core.initial_state(batch_size) if self._core is not None else ()

  def __call__(self, observation, state=()) -> Tuple[Tuple[dict, tf.Tensor], Nest]:
    x = self._inputs(observation)
    if self._core is None:
      return self._feed_forward(x), state
    out, next_state = self._core(x, state)
    return self._heads(out, out), next_state

  def unroll(self, observations, first, state=()):
    """`(head params {name: [T, B, ...]}, values [T, B])` over `[T, B, ...]` inputs."""
    x = self._inputs(observations)
    if self._core is None:
      return batch_apply(self._feed_forward, x)
    outputs, _ = self._core.unroll(x, first, state)
    return batch_apply(lambda o: self._heads(o, o), outputs)

  def update_normalizer(self, observations: tf.Tensor, mask: tf.Tensor | None = None):
    """Adds `[N, *obs_shape]` observations (rows where `mask`) to the statistics."""
    if self.normalizer is not None:
      self.normalizer.update(to_float(observations), mask)
