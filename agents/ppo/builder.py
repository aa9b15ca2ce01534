"""PPO's builder: a Reverb queue of unrolls, the action head's policy, the PPO learner."""

from typing import Any, Dict, List, Tuple

import numpy as np
import reverb
import tensorflow as tf
import tree

from seedacme import builder as builder_lib
from seedacme.agents.ppo import acting, learning, networks
from seedacme.agents.ppo.config import PPOConfig
from seedacme.trajectories.datasets import ReverbBatches
from seedacme.trajectories.sink import ReverbSequenceSink
from seedacme.types import EnvSpec, Nest

# What the policy stores with each step besides the env's action (agents/ppo/acting.py).
EXTRAS = ('raw_action', 'log_prob', 'value', 'policy_version')


class PPOBuilder(builder_lib.SeedBuilder):
  """Wires PPO into a SEED program."""

  name = 'ppo'
  continuous_actions = True
  table = 'ppo_unrolls'
  # Inference steps' worth of finished unrolls the writer may hold while the queue is
  # full. The writer's default (64) is V-trace's; for PPO it was the policy lag: on
  # HalfCheetah (16 envs) unrolls waited 11-12 learner steps. With this, a queue of
  # one batch and one batch sampled ahead (make_learner), MEASURED below.
  WRITER_PENDING = 1

  def __init__(self, config: PPOConfig = PPOConfig()):
    self.config = config

  @property
  def unroll_steps(self) -> int:
    """Steps stored per unroll: T transitions plus the bootstrap step."""
    return self.config.unroll_length + 1

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.queue_size, self.unroll_steps

  def _network(self, spec: EnvSpec) -> networks.PPONetwork:
    return networks.PPONetwork(spec, self.config)

  def item_signature(self, spec: EnvSpec) -> Dict[str, Any]:
    """`tf.TensorSpec`s of one Reverb item (an unroll)."""
    n = self.unroll_steps
    network = self._network(spec)
    raw = network.head.raw_spec
    signature = {
        'observation': tf.TensorSpec((n,) + spec.observation_shape,
                                     tf.as_dtype(spec.dtype)),
        'reward': tf.TensorSpec((n,), tf.float32),
        'discount': tf.TensorSpec((n,), tf.float32),
        'step_type': tf.TensorSpec((n,), tf.int8),
        'action': tf.TensorSpec((n,) + tuple(spec.action_shape),
                                tf.as_dtype(spec.action_dtype)),
        'raw_action': tf.TensorSpec((n,) + tuple(raw.shape), raw.dtype),
        'log_prob': tf.TensorSpec((n,), tf.float32),
        'value': tf.TensorSpec((n,), tf.float32),
        'policy_version': tf.TensorSpec((n,), tf.int32),
    }
    state = network.initial_state(1)
    if tree.flatten(state):
      signature['initial_state'] = tree.map_structure(
          lambda x: tf.TensorSpec(x.shape[1:], x.dtype), state)
    return signature

  def make_replay_tables(self, spec: EnvSpec) -> List[reverb.Table]:
    return [reverb.Table.queue(self.table, max_size=self.config.queue_size,
                               signature=self.item_signature(spec))]

  def make_networks(self, spec: EnvSpec) -> networks.PPONetwork:
    network = self._network(spec)
    dummy = np.zeros((1,) + spec.observation_shape, spec.dtype)
    network(tf.constant(dummy), network.initial_state(1))  # Create the variables now.
    return network

  def make_policy(self, networks_, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.PPOPolicy:
    del num_train_envs
    return acting.PPOPolicy(networks_, spec, num_envs, seed=self.config.seed)

  @staticmethod
  def _to_items(sequences: Nest) -> List[Tuple[float, Dict[str, Any]]]:
    """Unrolls as Reverb items; a queue ignores priorities, so all are 1."""
    n = sequences['action'].shape[0]
    state_leaves = tree.flatten(sequences['state'])
    items = []
    for i in range(n):
      item = {k: sequences[k][i] for k in ('observation', 'reward', 'discount',
                                           'step_type', 'action')}
      item.update({k: sequences['extras'][k][i] for k in EXTRAS})
      if state_leaves:
        item['initial_state'] = tree.map_structure(lambda x, i=i: x[i, 0], sequences['state'])
      items.append((1.0, item))
    return items

  def make_trajectory_sink(self, replay_client, num_envs: int,
                           spec: EnvSpec) -> ReverbSequenceSink:
    del spec
    return ReverbSequenceSink(
        replay_client, self.table, num_envs, length=self.unroll_steps,
        period=self.config.unroll_length, to_items=self._to_items,
        max_pending=self.WRITER_PENDING)

  def make_learner(self, networks_, replay_client, spec: EnvSpec) -> learning.PPOLearner:
    # Nothing sampled ahead beyond one batch: on-policy data (see WRITER_PENDING).
    batches = ReverbBatches(replay_client.server_address, self.table,
                            self.config.batch_size, prefetch=0,
                            max_in_flight=self.config.batch_size)
    return learning.PPOLearner(networks_, self.config, batches,
                               item_signature=self.item_signature(spec))
