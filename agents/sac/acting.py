"""SAC's server-side policy: a tanh-Normal sample per env; evaluation envs take the mean.

It stores the raw (pre-tanh) sample with each step: the learner's critics read
tanh(raw), the action in [-1, 1] units, whatever the env's bounds.
"""

import tensorflow as tf

from seedacme.serving.tf_policy import TFServerPolicy


class SACPolicy(TFServerPolicy):
  """Samples from the actor's squashed Normal; evaluators act with its mean."""

  def _act(self, observation, state, eval_mask, env_ids):
    del env_ids
    (params, _), next_state = self._network(observation, state)
    head = self._network.head
    sampled, greedy = head.sample(params, self._rng), head.mode(params)
    raw = tf.where(eval_mask[:, None], greedy, sampled)
    return head.to_env(raw), {'raw_action': raw}, next_state
