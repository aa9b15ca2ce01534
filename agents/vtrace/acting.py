"""V-trace's server-side policy: one batched forward pass, sampled (or greedy) actions.

Runs on the central node inside the inference server's batching thread. The network's
variables are the learner's own (same process, same objects): inference always uses the
latest parameters and nothing is copied over the network.
"""

from typing import Any

import numpy as np
import sonnet as snt
import tensorflow as tf
import tree

from seedacme.envs.registry import EnvSpec
from seedacme.policy import PolicyStep
from seedacme.tf_policy import TFServerPolicy

Nest = Any


class VTracePolicy(TFServerPolicy):
  """Samples from the policy network's logits; greedy envs take the argmax."""

  def __init__(self, network: snt.Module, spec: EnvSpec, seed: int = 0,
               device: str = ''):
    super().__init__(network, seed, device)
    self._spec = spec
    # XLA: also the cure for TF 2.8.4's ~0.35 KB leaked per plain tf.function call,
    # which at hundreds of inference batches a second grew the central node ~5 MB/min.
    self._step = tf.function(self._step_graph, jit_compile=True)

  def _step_graph(self, observation, state, greedy):
    with tf.device(self._device):
      (logits, _), next_state = self._network(observation, state)
      sampled = tf.squeeze(self._rng_categorical(logits), axis=-1)
      action = tf.where(greedy, tf.argmax(logits, axis=-1, output_type=tf.int32), sampled)
    return action, logits, next_state

  def _rng_categorical(self, logits):
    # Gumbel-max with a stateful generator: reproducible given the seed.
    u = self._rng.uniform(tf.shape(logits), minval=1e-20, maxval=1.0)
    return tf.argmax(logits - tf.math.log(-tf.math.log(u)), axis=-1,
                     output_type=tf.int32)[:, None]

  def step(self, observation: np.ndarray, state: Nest, greedy: np.ndarray,
           env_ids: np.ndarray) -> PolicyStep:
    del env_ids  # Every env samples from the same policy.
    action, logits, next_state = self._step(
        tf.constant(observation), tree.map_structure(tf.constant, state),
        tf.constant(greedy, tf.bool))
    return PolicyStep(action=action.numpy(), extras={'logits': logits.numpy()},
                      state=tree.map_structure(lambda x: x.numpy(), next_state))
