"""The interface between the SEED machinery and an agent's server-side policy.

A `ServerPolicy` runs on the central node, once per inference batch, over envs from
many actors at once. It owns every env's recurrent state, keyed by global env id (SEED
keeps it on the accelerator: `seedacme.serving.tf_policy`), so one call does the whole batch
step: gather the state of the batch's envs, reset the ones that start over, run the
network, pick actions, store the next state. The inference server only says which
envs must start from the initial state (a FIRST step, or an actor restart).
"""

import abc
from typing import Any, Dict, NamedTuple, Sequence

import numpy as np
from seedacme.types import Nest



class PolicyStep(NamedTuple):
  """What a policy returns for a batch of B envs."""
  action: np.ndarray  # [B, *action_shape]: int32 indices or float32 continuous actions
  extras: Dict[str, np.ndarray]  # per-env data stored with the step (e.g. logits [B, A])
  state: Nest  # the recurrent state each env acted FROM (after any reset), leaves
  # [B, ...]; () for feed-forward policies. Trajectories store it as an initial state.


class ServerPolicy(abc.ABC):
  """A batched policy evaluated centrally; holds the state of `num_envs` envs."""

  num_envs: int

  @abc.abstractmethod
  def step(self, env_ids: np.ndarray, observation: np.ndarray, reset: np.ndarray,
           eval_mask: np.ndarray) -> PolicyStep:
    """Picks actions for a batch of distinct envs and advances their state.

    Args:
      env_ids: int `[B]` global env ids, distinct (training envs are
        0..num_train_envs-1, for per-env behaviour such as R2D2's exploration).
      observation: `[B, *obs_shape]` in the env's own dtype (uint8 frames stay uint8
        on the wire; the policy converts on the accelerator).
      reset: bool `[B]`; these envs act from the initial recurrent state.
      eval_mask: bool `[B]`: the envs of `Mode.EVAL` requests (the evaluator), which
        take the most likely action and are not trained on.
    """

  @abc.abstractmethod
  def state_of(self, env_ids: Sequence[int]) -> Nest:
    """The stored recurrent state of these envs (numpy leaves `[len(env_ids), ...]`)."""

  def warm_up(self, batch_sizes: Sequence[int]) -> None:
    """Prepares (compiles) the batch step for these batch sizes before serving."""

  def acting_state(self, env_ids: Sequence[int]) -> Dict[str, Any] | None:
    """What these envs act from besides the weights -- recurrent state, the action
    noise generator -- for a reproducible run's round checkpoint (None: this policy
    cannot save it, and a resume from it is not exact)."""
    del env_ids
    return None

  def load_acting_state(self, env_ids: Sequence[int], state: Dict[str, Any]) -> None:
    """Continues from `acting_state(env_ids)`."""
    raise NotImplementedError(f'{type(self).__name__} cannot load a saved acting state')


class StatelessPolicy(ServerPolicy):
  """A feed-forward policy computed on the host (numpy): no recurrent state to keep.

  For policies that are not TensorFlow networks (scripted, or the no-work policy of
  `bench/inference_service.py`); subclasses implement `act`.
  """

  def __init__(self, num_envs: int):
    self.num_envs = num_envs

  @abc.abstractmethod
  def act(self, observation: np.ndarray, eval_mask: np.ndarray,
          env_ids: np.ndarray) -> PolicyStep:
    """Actions (and extras) for a batch; `state` in the result is ()."""

  def step(self, env_ids, observation, reset, eval_mask) -> PolicyStep:
    del reset  # Nothing to reset.
    return self.act(observation, eval_mask, env_ids)

  def state_of(self, env_ids: Sequence[int]) -> Nest:
    return ()
