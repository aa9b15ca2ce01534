"""SAC's builder: a uniform Reverb replay of (n+1)-step items with a sample-to-insert
limiter, the actor as the served policy, the SAC learner.

Items are packed into one float32 column by default (`SACConfig.packed_items`,
`seedacme.trajectories.packing`): a sampled batch of 256 five-column items cost 2.4x
the CPU of packed ones, on the 2 cores the learner shares with acting.

A reproducible run (`ProgramConfig.reproducible`) replaces the Reverb table by an
in-process replay sampled by a seeded generator, in rounds whose learner steps the
samples-per-insert ratio fixes (`seedacme.trajectories.local_replay`: Reverb 0.7's
samplers cannot be seeded); the central node sets `schedule` (`round_schedule`) before
it makes the sink and the learner, which then share that replay.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Tuple

import numpy as np

from seedacme import builder as builder_lib
from seedacme import lazy
from seedacme.agents.sac.config import SACConfig
from seedacme.trajectories.limits import rate_limiter
from seedacme.trajectories.sink import ReverbSequenceSink
from seedacme.types import EnvSpec, Nest

# Imported at first use: a launcher builds the program without TensorFlow (seedacme.lazy).
tf = lazy.load('tensorflow')
reverb = lazy.load('reverb')
acting = lazy.load('seedacme.agents.sac.acting')
learning = lazy.load('seedacme.agents.sac.learning')
networks = lazy.load('seedacme.agents.sac.networks')
packing = lazy.load('seedacme.trajectories.packing')
datasets = lazy.load('seedacme.trajectories.datasets')
local_replay = lazy.load('seedacme.trajectories.local_replay')

_FIELDS = ('observation', 'reward', 'discount', 'step_type')


class SACBuilder(builder_lib.SeedBuilder):
  """Wires SAC into a SEED program (continuous actions only)."""

  name = 'sac'
  table = 'sac_transitions'
  continuous_actions = True
  schedule = None  # reproducible runs: set by the central node (`round_schedule`)

  def __init__(self, config: SACConfig = SACConfig()):
    self.config = config
    self._local_replay = None  # a reproducible run's replay (made with the sink)

  def round_schedule(self, num_train_envs: int, lag: int = 0):
    """Rounds whose learner steps `samples_per_insert` fixes, learning from the round
    the replay holds `min_replay_size` items (`ReplayRoundSchedule`)."""
    c = self.config
    return local_replay.ReplayRoundSchedule(
        num_train_envs, c.samples_per_insert, c.batch_size, c.sgd_steps_per_sample,
        self.item_steps, c.min_replay_size, lag=lag)

  def local_replay(self):
    """The in-process replay of a reproducible run (one per builder: the sink writes
    it, the learner samples it)."""
    if self._local_replay is None:
      self._local_replay = local_replay.LocalReplay(self.config.replay_size)
    return self._local_replay

  def check_spec(self, spec: EnvSpec) -> None:
    if not spec.continuous:
      raise ValueError(f'agent {self.name!r} cannot serve this env: it has '
                       f'{spec.describe_actions()}, and sac acts on continuous actions '
                       'only (vtrace, r2d2 and ppo serve discrete ones)')

  @property
  def item_steps(self) -> int:
    return self.config.n_step + 1

  @property
  def replay_checkpoint_interval_s(self) -> float | None:
    return self.config.replay_checkpoint_interval_s

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.replay_size, self.item_steps

  def layout(self, spec: EnvSpec) -> packing.PackedLayout | None:
    """How items are packed (None: `packed_items` off, one column per field)."""
    if not self.config.packed_items:
      return None
    obs_dtype = np.float32 if np.dtype(spec.dtype) == np.float64 else spec.dtype
    return packing.PackedLayout({'observation': (spec.observation_shape, obs_dtype),
                         'reward': ((), np.float32), 'discount': ((), np.float32),
                         'step_type': ((), np.int8),
                         'raw_action': ((int(spec.action_size),), np.float32)})

  def item_signature(self, spec: EnvSpec) -> Dict[str, Any]:
    n = self.item_steps
    layout = self.layout(spec)
    if layout is not None:
      return layout.signature(n)
    size = int(spec.action_size)
    return {
        'observation': tf.TensorSpec((n,) + spec.observation_shape, tf.as_dtype(spec.dtype)),
        'reward': tf.TensorSpec((n,), tf.float32),
        'discount': tf.TensorSpec((n,), tf.float32),
        'step_type': tf.TensorSpec((n,), tf.int8),
        'raw_action': tf.TensorSpec((n, size), tf.float32),
    }

  def make_replay_tables(self, spec: EnvSpec) -> List[reverb.Table]:
    c = self.config
    limiter = rate_limiter(c.samples_per_insert, c.min_replay_size, c.sample_size)
    return [reverb.Table(name=self.table, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=c.replay_size,
                         rate_limiter=limiter, signature=self.item_signature(spec))]

  def make_networks(self, spec: EnvSpec) -> networks.SACNetworks:
    nets = networks.SACNetworks(spec, self.config)
    nets.create_variables(spec)
    return nets

  def policy_network(self, networks_: networks.SACNetworks):
    return networks_.actor

  def make_policy(self, networks_, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.SACPolicy:
    del num_train_envs
    return acting.SACPolicy(networks_.actor, spec, num_envs, seed=self.config.seed)

  @staticmethod
  def _to_items(sequences: Nest, layout: packing.PackedLayout | None = None
                ) -> List[Tuple[float, Dict[str, Any]]]:
    n = sequences['step_type'].shape[0]
    items = []
    for i in range(n):
      item = {k: sequences[k][i] for k in _FIELDS}
      item['raw_action'] = sequences['extras']['raw_action'][i]
      items.append((1.0, layout.pack(item) if layout is not None else item))
    return items

  def make_trajectory_sink(self, replay_client, num_envs: int,
                           spec: EnvSpec) -> ReverbSequenceSink:
    if self.schedule is not None:
      return local_replay.LocalReplaySink(
          self.local_replay(), num_envs, length=self.item_steps, period=1,
          to_items=functools.partial(self._to_items, layout=self.layout(spec)))
    return ReverbSequenceSink(replay_client, self.table, num_envs, length=self.item_steps,
                              period=1, to_items=functools.partial(
                                  self._to_items, layout=self.layout(spec)))

  def make_learner(self, networks_, replay_client, spec: EnvSpec) -> learning.SACLearner:
    if self.schedule is not None:
      batches = local_replay.LocalReplayBatches(self.local_replay(), self.schedule,
                                                self.config.seed, self.config.sample_size)
    else:
      batches = datasets.ReverbBatches(replay_client.server_address, self.table,
                                       self.config.sample_size)
    learner = learning.SACLearner(networks_, self.config, batches,
                                  item_signature=self.item_signature(spec),
                                  layout=self.layout(spec))
    if self.schedule is not None:  # step j samples with the generator keyed by j
      batches.steps_done = lambda: int(learner.num_steps.numpy())
    return learner
