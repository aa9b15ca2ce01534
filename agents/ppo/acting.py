"""PPO's server-side policy: one batched forward pass, a sampled (or greedy) action.

Runs inside the inference server's compiled batch step (`seedacme.serving.tf_policy`).
Besides the env action it returns what the learner needs from the behaviour policy:
the head's raw sample (the pre-squash Normal draw, or the index: log-probabilities
are then exact, no inverse tanh), its log-probability, the value (PPO2's value clip),
the learner step the weights came from (`policy_version`: the measured policy lag) and
the env's id (the reward normalizer carries each env's return across its unrolls).
"""

import tensorflow as tf

from seedacme.serving.tf_policy import TFServerPolicy
from seedacme.types import EnvSpec


class PPOPolicy(TFServerPolicy):
  """Samples from the action head; evaluation envs take its mode."""

  def __init__(self, network, spec: EnvSpec, num_envs: int, seed: int = 0,
               device: str = ''):
    super().__init__(network, spec, num_envs, seed, device)

  def _act(self, observation, state, eval_mask, env_ids):
    (params, value), next_state = self._network(observation, state)
    head = self._network.head
    sampled, greedy = head.sample(params, self._rng), head.mode(params)
    mask = tf.reshape(eval_mask, [-1] + [1] * (sampled.shape.rank - 1))
    raw = tf.where(mask, greedy, sampled)
    extras = {'raw_action': raw, 'log_prob': head.log_prob(params, raw), 'value': value,
              'policy_version': tf.fill(tf.shape(env_ids), self._network.version),
              'env_id': tf.cast(env_ids, tf.int32)}
    return head.to_env(raw), extras, next_state
