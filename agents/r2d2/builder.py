"""R2D2's builder: a prioritized Reverb table of overlapping sequences, per-env
epsilon-greedy on the server, the R2D2 learner with priority updates.

A reproducible run (`ProgramConfig.reproducible`) replaces the Reverb table by an
in-process replay sampled in proportion to priority^`priority_exponent` by a seeded
generator, the learner's new priorities set there after each step, before the next
sample (`seedacme.trajectories.local_replay`: Reverb 0.7's samplers cannot be
seeded); rounds are whole `period`s, their learner steps fixed by `samples_per_insert`.
"""

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
local_replay = lazy.load('seedacme.trajectories.local_replay')



@dataclasses.dataclass
class R2D2Networks:
  online: snt.Module
  target: snt.Module


class R2D2Builder(builder_lib.SeedBuilder):
  """Wires R2D2 into a SEED program."""

  name = 'r2d2'
  multi_device_learner = True
  table = 'r2d2_sequences'

  schedule = None  # reproducible runs: set by the central node (`round_schedule`)

  def __init__(self, config: R2D2Config = R2D2Config()):
    self.config = config
    self._local_replay = None  # a reproducible run's replay (made with the sink)

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.replay_size, self.config.sequence_length

  def round_schedule(self, num_train_envs: int, lag: int = 0):
    """Rounds whose learner steps `samples_per_insert` fixes (a round is whole periods
    of sequences), learning from the round the replay holds `min_replay_size`
    sequences (`ReplayRoundSchedule`)."""
    c = self.config
    return local_replay.ReplayRoundSchedule(
        num_train_envs, c.samples_per_insert, c.batch_size, c.sgd_steps_per_sample,
        c.sequence_length, c.min_replay_size, lag=lag, item_period=c.period)

  def local_replay(self):
    """The in-process replay of a reproducible run (one per builder: the sink writes
    it, the learner samples it)."""
    if self._local_replay is None:
      self._local_replay = local_replay.LocalReplay(self.config.replay_size)
    return self._local_replay

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
    if self.schedule is not None:
      return local_replay.LocalReplaySink(
          self.local_replay(), num_envs, length=self.config.sequence_length,
          period=self.config.period, to_items=self._to_items)
    return ReverbSequenceSink(
        replay_client, self.table, num_envs, length=self.config.sequence_length,
        period=self.config.period, to_items=self._to_items)

  def policy_network(self, networks_: R2D2Networks) -> snt.Module:
    return networks_.online

  def make_learner(self, networks_: R2D2Networks, replay_client,
                   spec: EnvSpec) -> learning.R2D2Learner:
    c = self.config
    if self.schedule is not None:  # prioritized sampling in process, priorities set there
      batches = local_replay.LocalReplayBatches(
          self.local_replay(), self.schedule, c.seed, c.sample_size,
          priority_exponent=c.priority_exponent, signature=self.item_signature(spec))
      replay_client = None
    else:
      batches = datasets.ReverbBatches(replay_client.server_address, self.table,
                                       c.sample_size, with_info=True)
    learner = learning.R2D2Learner(networks_.online, networks_.target, c, batches,
                                   replay_client, self.table,
                                   item_signature=self.item_signature(spec))
    if self.schedule is not None:  # step j samples with the generator keyed by j
      batches.steps_done = lambda: int(learner.num_steps.numpy())
    return learner
