"""V-trace's server-side policy: one batched forward pass, sampled (or greedy) actions.

Runs on the central node inside the inference server's batch, as one compiled call
with each env's recurrent state on the device (`seedacme.serving.tf_policy`). The network's
variables are the learner's own (same process, same objects): inference always uses
the latest parameters and nothing is copied over the network.
"""

import sonnet as snt
import tensorflow as tf

from seedacme.types import EnvSpec
from seedacme.serving.tf_policy import TFServerPolicy


class VTracePolicy(TFServerPolicy):
  """Samples from the policy network's logits (or its continuous action head);
  evaluation envs take the argmax (the head's mode)."""

  def __init__(self, network: snt.Module, spec: EnvSpec, num_envs: int, seed: int = 0,
               device: str = ''):
    super().__init__(network, spec, num_envs, seed, device)

  def _act(self, observation, state, eval_mask, env_ids):
    # Every env samples from the same policy; its id is stored with its steps.
    env_id = tf.cast(env_ids, tf.int32)
    head = getattr(self._network, 'action_head', None)
    if head is not None:
      (params, _), next_state = self._network(observation, state)
      sampled, greedy = head.sample(params, self._rng), head.mode(params)
      raw = tf.where(tf.reshape(eval_mask, [-1] + [1] * (sampled.shape.rank - 1)),
                     greedy, sampled)
      extras = {'raw_action': raw, 'log_prob': head.log_prob(params, raw), 'env_id': env_id}
      return head.to_env(raw), extras, next_state
    (logits, _), next_state = self._network(observation, state)
    # Gumbel-max with a stateful generator: reproducible given the seed.
    u = self._rng.uniform(tf.shape(logits), minval=1e-20, maxval=1.0)
    sampled = tf.argmax(logits - tf.math.log(-tf.math.log(u)), axis=-1,
                        output_type=tf.int32)
    action = tf.where(eval_mask, tf.argmax(logits, axis=-1, output_type=tf.int32), sampled)
    return action, {'logits': logits, 'env_id': env_id}, next_state
