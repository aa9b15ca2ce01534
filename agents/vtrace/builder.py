"""V-trace's builder: a Reverb queue of unrolls, a sampling policy, the V-trace learner."""

from __future__ import annotations

from typing import Any, Dict

from seedacme import builder as builder_lib
from seedacme import lazy
from seedacme.agents.vtrace.config import VTraceConfig
from seedacme.types import EnvSpec

# Imported at first use: a launcher builds the program without TensorFlow (seedacme.lazy).
tf = lazy.load('tensorflow')
acting = lazy.load('seedacme.agents.vtrace.acting')
learning = lazy.load('seedacme.agents.vtrace.learning')
networks = lazy.load('seedacme.agents.vtrace.networks')
distributions = lazy.load('seedacme.distributions')
normalization = lazy.load('seedacme.normalization')


class VTraceBuilder(builder_lib.UnrollQueueBuilder):
  """Wires V-trace into a SEED program (the queue of unrolls: `UnrollQueueBuilder`)."""

  name = 'vtrace'
  continuous_actions = True
  multi_device_learner = True
  table = 'vtrace_unrolls'

  def __init__(self, config: VTraceConfig = VTraceConfig()):
    super().__init__(config)

  def _network(self, spec: EnvSpec):
    c = self.config
    head = (distributions.make_action_head(spec, squash=c.squash,
                                           init_log_std=c.init_log_std)
            if spec.continuous else None)
    normalizer = (normalization.RunningNormalizer(spec.observation_shape,
                                                  clip=c.observation_clip)
                  if c.normalize_observations else None)
    return networks.make_network(c.core, spec.num_actions, c.hidden_sizes, c.lstm_size,
                                 c.torso, head, normalizer)

  def extras_signature(self, spec: EnvSpec, network) -> Dict[str, Any]:
    """The behaviour policy per step: logits, or the continuous head's raw sample and
    its log-probability (agents/vtrace/acting.py); and the env's id, by which a
    reproducible run orders each round's unrolls (`RoundBatches`)."""
    env_id = {'env_id': tf.TensorSpec((), tf.int32)}
    if spec.continuous:
      return {'raw_action': network.action_head.raw_spec,
              'log_prob': tf.TensorSpec((), tf.float32), **env_id}
    return {'logits': tf.TensorSpec((spec.num_actions,), tf.float32), **env_id}

  def make_policy(self, networks_, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.VTracePolicy:
    del num_train_envs
    return acting.VTracePolicy(networks_, spec, num_envs, seed=self.config.seed)

  def make_learner(self, networks_, replay_client, spec: EnvSpec) -> learning.VTraceLearner:
    batches = self.make_batches(replay_client)
    return learning.VTraceLearner(networks_, self.config, batches,
                                  item_signature=self.item_signature(spec))
