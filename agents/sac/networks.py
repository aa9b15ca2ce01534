"""SAC's networks: a tanh-Normal actor, twin Q critics and their Polyak-averaged targets.

The actor is the shared `NormalHead` (seedacme/distributions.py) with a state-dependent
log-std (log-std in [-5, 2], CleanRL's range) on a ReLU MLP; it is what the server runs
and what is exported. Critics read the observation and the action in [-1, 1] units
(tanh of the stored raw sample), whatever the env's bounds: one scale for every task.
The temperature is `log_alpha`, a variable of its own.
"""

import numpy as np
import sonnet as snt
import tensorflow as tf

from seedacme.agents.sac.config import SACConfig
from seedacme.distributions import NormalHead
from seedacme.networks import to_float
from seedacme.normalization import RunningNormalizer
from seedacme.types import EnvSpec, Nest

LOG_STD_RANGE = (-5.0, 2.0)


class Actor(snt.Module):
  """Observation -> MLP -> tanh-Normal parameters; feed-forward (state `()`)."""

  def __init__(self, spec: EnvSpec, config: SACConfig, name: str = 'actor'):
    super().__init__(name=name)
    self.normalizer = (RunningNormalizer(spec.observation_shape)
                       if config.observation_normalization else None)
    self._torso = snt.nets.MLP(list(config.hidden_sizes), activate_final=True,
                               name='actor_mlp')
    self.head = NormalHead(spec, squash='tanh', mean_init_scale=1.0,
                           log_std_range=LOG_STD_RANGE, state_dependent_std=True)

  def inputs(self, observation: tf.Tensor) -> tf.Tensor:
    x = snt.Flatten()(to_float(observation))
    return self.normalizer(x) if self.normalizer is not None else x

  def initial_state(self, batch_size: int) -> Nest:
    del batch_size
    return ()

  def __call__(self, observation, state=()):
    return (self.head(self._torso(self.inputs(observation))), ()), state


class Critic(snt.Module):
  """Q(observation, action in [-1, 1]) -> [B]."""

  def __init__(self, config: SACConfig, name: str):
    super().__init__(name=name)
    self._mlp = snt.nets.MLP(list(config.hidden_sizes) + [1], name=name + '_mlp')

  def __call__(self, inputs: tf.Tensor, unit_action: tf.Tensor) -> tf.Tensor:
    return tf.squeeze(self._mlp(tf.concat([inputs, unit_action], axis=-1)), axis=-1)


class SACNetworks(snt.Module):
  """The actor, twin critics, their targets and the temperature."""

  def __init__(self, spec: EnvSpec, config: SACConfig, name: str = 'sac_networks'):
    super().__init__(name=name)
    self.actor = Actor(spec, config)
    self.critics = [Critic(config, f'critic_{i}') for i in (1, 2)]
    self.targets = [Critic(config, f'target_critic_{i}') for i in (1, 2)]
    self.log_alpha = tf.Variable(np.log(config.initial_alpha), dtype=tf.float32,
                                 name='log_alpha')

  def create_variables(self, spec: EnvSpec) -> None:
    observation = tf.zeros((1,) + tuple(spec.observation_shape), spec.dtype)
    self.actor(observation)
    inputs = self.actor.inputs(observation)
    action = tf.zeros([1, self.actor.head.size])
    for critic in self.critics + self.targets:
      critic(inputs, action)
    for target, critic in zip(self.targets, self.critics):
      for t, c in zip(target.variables, critic.variables):
        t.assign(c)

  def critic_variables(self):
    return [v for c in self.critics for v in c.trainable_variables]
