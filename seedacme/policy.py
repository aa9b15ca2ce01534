"""The interface between the SEED machinery and an agent's server-side policy.

A `ServerPolicy` runs on the central node, once per inference batch, over envs from
many actors at once. It never sees env ids: the inference server gathers each env's
recurrent state from its table, calls `step`, and scatters the new state back.
"""

import abc
from typing import Any, Dict, NamedTuple

import numpy as np

Nest = Any


class PolicyStep(NamedTuple):
  """What a policy returns for a batch of B envs."""
  action: np.ndarray  # int32 [B]
  extras: Dict[str, np.ndarray]  # per-env data stored with the step (e.g. logits [B, A])
  state: Nest  # next recurrent state, leaves [B, ...]; () for feed-forward policies


class ServerPolicy(abc.ABC):
  """A batched policy evaluated centrally."""

  @abc.abstractmethod
  def initial_state(self, batch_size: int) -> Nest:
    """Recurrent state for `batch_size` fresh envs (numpy leaves `[B, ...]`)."""

  @abc.abstractmethod
  def step(self, observation: np.ndarray, state: Nest, greedy: np.ndarray,
           env_ids: np.ndarray) -> PolicyStep:
    """Picks actions for a batch of envs.

    Args:
      observation: `[B, *obs_shape]` in the env's own dtype (uint8 frames stay uint8
        on the wire; the policy converts on the accelerator).
      state: recurrent state before this step, leaves `[B, ...]`.
      greedy: bool `[B]`; greedy envs take the most likely action (evaluation).
      env_ids: int `[B]` global env ids, for per-env behaviour such as R2D2's
        exploration schedule (training envs are 0..num_train_envs-1).
    """
