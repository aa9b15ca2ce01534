"""R2D2's server-side policy: batched Q-values, epsilon-greedy with a per-env epsilon.

Ape-X/R2D2 give each actor its own exploration rate. With central inference the server
applies them: training env i of N gets eps_i = base^(1 + alpha i / (N - 1)); evaluation
envs (`Mode.EVAL` requests) use `evaluation_epsilon`. The epsilons live on the device beside
the recurrent state, and the whole epsilon-greedy step is one compiled call
(`seedacme.serving.tf_policy`).
"""

import numpy as np
import tensorflow as tf

from seedacme.types import EnvSpec
from seedacme.serving.tf_policy import TFServerPolicy


def apex_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
  """eps_i = base^(1 + alpha i / (N - 1)) for i = 0..N-1 (N = 1: just `base`)."""
  if num_envs == 1:
    return np.array([base], np.float32)
  i = np.arange(num_envs, dtype=np.float64)
  return (base ** (1.0 + alpha * i / (num_envs - 1))).astype(np.float32)


class R2D2Policy(TFServerPolicy):
  """Epsilon-greedy over the recurrent Q-network, one epsilon per training env."""

  def __init__(self, network, spec: EnvSpec, num_train_envs: int, num_envs: int,
               epsilon_base: float, epsilon_alpha: float,
               evaluation_epsilon: float = 0.0, seed: int = 0, device: str = ''):
    super().__init__(network, spec, num_envs, seed, device)
    self._num_actions = spec.num_actions
    self.epsilons = apex_epsilons(num_train_envs, epsilon_base, epsilon_alpha)
    self._evaluation_epsilon = evaluation_epsilon
    # Per env id (the scratch row included): training ids index the Ape-X schedule.
    ids = np.minimum(np.arange(num_envs + 1), len(self.epsilons) - 1)
    with tf.device(self.device):
      self._epsilon_table = tf.constant(self.epsilons[ids])

  def epsilon_of(self, env_ids: np.ndarray, eval_mask: np.ndarray) -> np.ndarray:
    """Per-env epsilon for a batch, as the compiled step applies it."""
    train_ids = np.minimum(env_ids, len(self.epsilons) - 1)
    return np.where(eval_mask, self._evaluation_epsilon,
                    self.epsilons[train_ids]).astype(np.float32)

  def _act(self, observation, state, eval_mask, env_ids):
    q, next_state = self._network(observation, state)
    epsilon = tf.where(eval_mask, tf.constant(self._evaluation_epsilon, tf.float32),
                       tf.gather(self._epsilon_table, env_ids))
    batch = tf.shape(q)[0]
    random_action = self._rng.uniform([batch], 0, self._num_actions, dtype=tf.int32)
    explore = self._rng.uniform([batch]) < epsilon
    action = tf.where(explore, random_action, tf.argmax(q, axis=-1, output_type=tf.int32))
    return action, {'q': q}, next_state
