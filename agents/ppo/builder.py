"""PPO's builder: a Reverb queue of unrolls, the action head's policy, the PPO learner."""

from __future__ import annotations

from typing import Any, Dict

from seedacme import builder as builder_lib
from seedacme import lazy
from seedacme.agents.ppo.config import PPOConfig
from seedacme.types import EnvSpec

# Imported at first use: a launcher builds the program without TensorFlow (seedacme.lazy).
tf = lazy.load('tensorflow')
acting = lazy.load('seedacme.agents.ppo.acting')
learning = lazy.load('seedacme.agents.ppo.learning')
networks = lazy.load('seedacme.agents.ppo.networks')


def sampled_ahead(config: PPOConfig) -> int:
  """Unrolls the learner's sampler may take off the queue before they are asked for:
  none beyond one batch, nor beyond the queue (on-policy data: see `writer_pending`,
  `PPOConfig.queue_size`, tests/unit/test_ppo_pipeline.py)."""
  return min(config.batch_size, config.queue_size)


class PPOBuilder(builder_lib.UnrollQueueBuilder):
  """Wires PPO into a SEED program (the queue of unrolls: `UnrollQueueBuilder`)."""

  name = 'ppo'
  continuous_actions = True
  multi_device_learner = True
  table = 'ppo_unrolls'
  # Items the trajectory writer may hold while the queue is full. The writer's default
  # (64) was PPO's policy lag: on HalfCheetah (16 envs) unrolls waited 11-12 learner
  # steps; with 1, a queue of one batch and one batch sampled ahead (make_learner),
  # ~4 (docs/benchmarks.md, "PPO and continuous control").
  writer_pending = 1

  def __init__(self, config: PPOConfig = PPOConfig()):
    super().__init__(config)

  def _network(self, spec: EnvSpec) -> networks.PPONetwork:
    return networks.PPONetwork(spec, self.config)

  def extras_signature(self, spec: EnvSpec, network) -> Dict[str, Any]:
    """What `acting.PPOPolicy` stores per step (agents/ppo/acting.py)."""
    return {'raw_action': network.head.raw_spec, 'log_prob': tf.TensorSpec((), tf.float32),
            'value': tf.TensorSpec((), tf.float32),
            'policy_version': tf.TensorSpec((), tf.int32),
            'env_id': tf.TensorSpec((), tf.int32)}

  def make_policy(self, networks_, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> acting.PPOPolicy:
    del num_train_envs
    return acting.PPOPolicy(networks_, spec, num_envs, seed=self.config.seed)

  def make_learner(self, networks_, replay_client, spec: EnvSpec) -> learning.PPOLearner:
    batches = self.make_batches(replay_client, prefetch=0,
                                max_in_flight=sampled_ahead(self.config))
    return learning.PPOLearner(networks_, self.config, batches,
                               item_signature=self.item_signature(spec))
