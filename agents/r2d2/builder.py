"""R2D2's builder: a prioritized Reverb table of overlapping sequences, per-env
epsilon-greedy on the server, the R2D2 learner with priority updates."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import numpy as np
import tree

from seedacme import builder as builder_lib
from seedacme import lazy
from seedacme.agents.r2d2.config import R2D2Config
from seedacme.trajectories.limits import rate_limiter
from seedacme.trajectories.sink import ReverbSequenceSink
from seedacme.types import EnvSpec
from seedacme.types import Nest

# Imported at first use: a launcher builds the program without TensorFlow (seedacme.lazy).
tf = lazy.load('tensorflow')
snt = lazy.load('sonnet')
reverb = lazy.load('reverb')
acting = lazy.load('seedacme.agents.r2d2.acting')
learning = lazy.load('seedacme.agents.r2d2.learning')
networks = lazy.load('seedacme.agents.r2d2.networks')
priorities = lazy.load('seedacme.agents.r2d2.priorities')
datasets = lazy.load('seedacme.trajectories.datasets')



@dataclasses.dataclass
class R2D2Networks:
  online: snt.Module
  target: snt.Module


class R2D2Builder(builder_lib.SeedBuilder):
  """Wires R2D2 into a SEED program."""

  name = 'r2d2'
  multi_device_learner = True
  table = 'r2d2_sequences'

  def __init__(self, config: R2D2Config = R2D2Config()):
    self.config = config

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.replay_size, self.config.sequence_length

  def round_schedule(self, num_train_envs: int, lag: int = 0):
    """None yet: refused by name (`ProgramConfig.check_reproducible`)."""
    del num_train_envs, lag
    raise ValueError(
        "agent 'r2d2' has no reproducible schedule: not yet: issue 63 Deliver 2: its "
        'replay is a prioritized Reverb table, and Reverb 0.7\'s samplers cannot be '
        'seeded (their generator is '
        'internal to the server: google-deepmind/reverb#25), so which sequences a '
        'learner step gets, and so its priority updates, depend on the server\'s '
        'threads; the in-process replay a reproducible run uses instead '
        '(seedacme/trajectories/local_replay.py) samples uniformly (SAC) and has no '
        'proportional sampling with priority updates yet')

  @property
  def replay_checkpoint_interval_s(self) -> float | None:
    return self.config.replay_checkpoint_interval_s

  def _network(self, spec: EnvSpec) -> networks.RecurrentQNetwork:
    c = self.config
    return networks.RecurrentQNetwork(spec.num_actions, c.hidden_sizes, c.lstm_size, c.dueling,
                                      c.torso)

  def item_signature(self, spec: EnvSpec) -> Dict[str, Any]:
    n = self.config.sequence_length
    return {
        'observation': tf.TensorSpec((n,) + spec.observation_shape, tf.as_dtype(spec.dtype)),
        'reward': tf.TensorSpec((n,), tf.float32),
        'discount': tf.TensorSpec((n,), tf.float32),
        'step_type': tf.TensorSpec((n,), tf.int8),
        'action': tf.TensorSpec((n,), tf.int32),
        'initial_state': (tf.TensorSpec((self.config.lstm_size,), tf.float32),) * 2,
    }

  def make_replay_tables(self, spec: EnvSpec) -> List[reverb.Table]:
    c = self.config
    limiter = rate_limiter(c.samples_per_insert, c.min_replay_size, c.sample_size)
    return [reverb.Table(
        name=self.table, sampler=reverb.selectors.Prioritized(c.priority_exponent),
        remover=reverb.selectors.Fifo(), max_size=c.replay_size, rate_limiter=limiter,
        signature=self.item_signature(spec))]

  def make_networks(self, spec: EnvSpec) -> R2D2Networks:
    nets = R2D2Networks(self._network(spec), self._network(spec))
    dummy = tf.constant(np.zeros((1,) + spec.observation_shape, spec.dtype))
    for net in (nets.online, nets.target):
      net(dummy, net.initial_state(1))  # Create the variables now.
    return nets

  def make_policy(self, networks_: R2D2Networks, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.R2D2Policy:
    c = self.config
    return acting.R2D2Policy(networks_.online, spec, num_train_envs, num_envs,
                             c.epsilon_base,
                             c.epsilon_alpha, c.evaluation_epsilon, seed=c.seed)

  def _to_items(self, sequences: Nest) -> List[Tuple[float, Dict[str, Any]]]:
    """Sequences as Reverb items, each with its initial priority from the server's Q."""
    c = self.config
    prios = priorities.sequence_priorities(
        sequences['extras']['q'], sequences['action'], sequences['reward'],
        sequences['discount'], sequences['step_type'], burn_in=c.burn_in, n_step=c.n_step,
        gamma=c.discount, eta=c.priority_eta, rescale_eps=c.value_rescaling_epsilon,
        reward_clip=c.reward_clip)
    items = []
    for i in range(len(prios)):
      items.append((float(prios[i]), {
          'observation': sequences['observation'][i],
          'reward': sequences['reward'][i],
          'discount': sequences['discount'][i],
          'step_type': sequences['step_type'][i],
          'action': sequences['action'][i],
          'initial_state': tuple(tree.map_structure(lambda x, i=i: x[i, 0],
                                                    sequences['state'])),
      }))
    return items

  def make_trajectory_sink(self, replay_client, num_envs: int,
                           spec: EnvSpec) -> ReverbSequenceSink:
    del spec
    return ReverbSequenceSink(
        replay_client, self.table, num_envs, length=self.config.sequence_length,
        period=self.config.period, to_items=self._to_items)

  def policy_network(self, networks_: R2D2Networks) -> snt.Module:
    return networks_.online

  def make_learner(self, networks_: R2D2Networks, replay_client,
                   spec: EnvSpec) -> learning.R2D2Learner:
    batches = datasets.ReverbBatches(replay_client.server_address, self.table,
                            self.config.sample_size, with_info=True)
    return learning.R2D2Learner(networks_.online, networks_.target, self.config, batches,
                                replay_client, self.table,
                                item_signature=self.item_signature(spec))
