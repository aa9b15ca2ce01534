"""V-trace's builder: a Reverb queue of unrolls, a sampling policy, the V-trace learner."""

from typing import Any, Dict, List, Tuple

import numpy as np
import reverb
import tensorflow as tf
import tree

from seedacme import builder as builder_lib
from seedacme.agents.vtrace import acting, learning, networks
from seedacme.agents.vtrace.config import VTraceConfig
from seedacme.trajectories.datasets import ReverbBatches
from seedacme.trajectories.sink import ReverbSequenceSink
from seedacme.distributions import make_action_head
from seedacme.normalization import RunningNormalizer
from seedacme.types import EnvSpec
from seedacme.types import Nest



class VTraceBuilder(builder_lib.SeedBuilder):
  """Wires V-trace into a SEED program."""

  name = 'vtrace'
  continuous_actions = True
  multi_device_learner = True
  table = 'vtrace_unrolls'

  def __init__(self, config: VTraceConfig = VTraceConfig()):
    self.config = config

  @property
  def unroll_steps(self) -> int:
    """Steps stored per unroll: T transitions plus the bootstrap step."""
    return self.config.unroll_length + 1

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.queue_size, self.unroll_steps

  def _network(self, spec: EnvSpec):
    c = self.config
    head = (make_action_head(spec, squash=c.squash, init_log_std=c.init_log_std)
            if spec.continuous else None)
    normalizer = (RunningNormalizer(spec.observation_shape, clip=c.observation_clip)
                  if c.normalize_observations else None)
    return networks.make_network(c.core, spec.num_actions, c.hidden_sizes, c.lstm_size,
                                 c.torso, head, normalizer)

  def item_signature(self, spec: EnvSpec) -> Dict[str, Any]:
    """`tf.TensorSpec`s of one Reverb item (an unroll)."""
    n = self.unroll_steps
    signature = {
        'observation': tf.TensorSpec((n,) + spec.observation_shape,
                                     tf.as_dtype(spec.dtype)),
        'reward': tf.TensorSpec((n,), tf.float32),
        'discount': tf.TensorSpec((n,), tf.float32),
        'step_type': tf.TensorSpec((n,), tf.int8),
        'action': tf.TensorSpec((n,) + tuple(spec.action_shape),
                                tf.as_dtype(spec.action_dtype)),
    }
    network = self._network(spec)
    if spec.continuous:  # the head's raw sample and its log-probability
      raw = network.action_head.raw_spec
      signature['raw_action'] = tf.TensorSpec((n,) + tuple(raw.shape), raw.dtype)
      signature['log_prob'] = tf.TensorSpec((n,), tf.float32)
    else:
      signature['logits'] = tf.TensorSpec((n, spec.num_actions), tf.float32)
    state = network.initial_state(1)
    if tree.flatten(state):
      signature['initial_state'] = tree.map_structure(
          lambda x: tf.TensorSpec(x.shape[1:], x.dtype), state)
    return signature

  def make_replay_tables(self, spec: EnvSpec) -> List[reverb.Table]:
    return [reverb.Table.queue(self.table, max_size=self.config.queue_size,
                               signature=self.item_signature(spec))]

  def make_networks(self, spec: EnvSpec):
    network = self._network(spec)
    dummy = np.zeros((1,) + spec.observation_shape, spec.dtype)
    network(tf.constant(dummy), network.initial_state(1))  # Create the variables now.
    return network

  def make_policy(self, networks_, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.VTracePolicy:
    del num_train_envs
    return acting.VTracePolicy(networks_, spec, num_envs, seed=self.config.seed)

  @staticmethod
  def _to_items(sequences: Nest) -> List[Tuple[float, Dict[str, Any]]]:
    """Unrolls as Reverb items; a queue ignores priorities, so all are 1."""
    n = sequences['action'].shape[0]
    state_leaves = tree.flatten(sequences['state'])
    items = []
    for i in range(n):
      item = {'observation': sequences['observation'][i],
              'reward': sequences['reward'][i],
              'discount': sequences['discount'][i],
              'step_type': sequences['step_type'][i],
              'action': sequences['action'][i],
              **{k: v[i] for k, v in sequences['extras'].items()}}
      if state_leaves:
        item['initial_state'] = tree.map_structure(lambda x, i=i: x[i, 0], sequences['state'])
      items.append((1.0, item))
    return items

  def make_trajectory_sink(self, replay_client, num_envs: int,
                           spec: EnvSpec) -> ReverbSequenceSink:
    del spec
    return ReverbSequenceSink(
        replay_client, self.table, num_envs, length=self.unroll_steps,
        period=self.config.unroll_length, to_items=self._to_items)

  def make_learner(self, networks_, replay_client, spec: EnvSpec) -> learning.VTraceLearner:
    batches = ReverbBatches(replay_client.server_address, self.table,
                            self.config.batch_size)
    return learning.VTraceLearner(networks_, self.config, batches,
                                  item_signature=self.item_signature(spec))
