"""R2D2's server-side policy: batched Q-values, epsilon-greedy with a per-env epsilon.

Ape-X/R2D2 give each actor its own exploration rate. With central inference the server
applies them: training env i of N gets eps_i = base^(1 + alpha i / (N - 1)); evaluation
envs (greedy requests) use `evaluation_epsilon`.
"""

from typing import Any

import numpy as np
import tensorflow as tf
import tree

from seedacme.envs.registry import EnvSpec
from seedacme.policy import PolicyStep
from seedacme.tf_policy import TFServerPolicy

Nest = Any


def apex_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
  """eps_i = base^(1 + alpha i / (N - 1)) for i = 0..N-1 (N = 1: just `base`)."""
  if num_envs == 1:
    return np.array([base], np.float32)
  i = np.arange(num_envs, dtype=np.float64)
  return (base ** (1.0 + alpha * i / (num_envs - 1))).astype(np.float32)


class R2D2Policy(TFServerPolicy):
  """Epsilon-greedy over the recurrent Q-network, one epsilon per training env."""

  def __init__(self, network, spec: EnvSpec, num_train_envs: int, epsilon_base: float,
               epsilon_alpha: float, evaluation_epsilon: float = 0.0, seed: int = 0,
               device: str = ''):
    super().__init__(network, seed, device)
    self._num_actions = spec.num_actions
    self.epsilons = apex_epsilons(num_train_envs, epsilon_base, epsilon_alpha)
    self._evaluation_epsilon = evaluation_epsilon
    self._step = tf.function(self._step_graph, jit_compile=True)  # see vtrace/acting.py

  def epsilon_of(self, env_ids: np.ndarray, greedy: np.ndarray) -> np.ndarray:
    """Per-env epsilon for a batch (training ids index the Ape-X schedule)."""
    train_ids = np.minimum(env_ids, len(self.epsilons) - 1)
    return np.where(greedy, self._evaluation_epsilon, self.epsilons[train_ids]).astype(np.float32)

  def _step_graph(self, observation, state, epsilon):
    with tf.device(self._device):
      q, next_state = self._network(observation, state)
      batch = tf.shape(q)[0]
      random_action = self._rng.uniform([batch], 0, self._num_actions, dtype=tf.int32)
      explore = self._rng.uniform([batch]) < epsilon
      action = tf.where(explore, random_action, tf.argmax(q, axis=-1, output_type=tf.int32))
    return action, q, next_state

  def step(self, observation: np.ndarray, state: Nest, greedy: np.ndarray,
           env_ids: np.ndarray) -> PolicyStep:
    action, q, next_state = self._step(
        tf.constant(observation), tree.map_structure(tf.constant, state),
        tf.constant(self.epsilon_of(env_ids, greedy)))
    return PolicyStep(action=action.numpy(), extras={'q': q.numpy()},
                      state=tree.map_structure(lambda x: x.numpy(), next_state))
