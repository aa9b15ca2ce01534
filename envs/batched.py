"""K environments stepped as one batch (the actor's side of SEED's protocol).

`BatchedEnv` is the plain synchronous engine: a Python loop over K dm_env
environments. An episode that ended on the previous step is restarted on the next
`step` call (the action sent for its LAST step is ignored), so every call returns K
timesteps and the server sees LAST followed by FIRST for each env, as dm_env intends.
Engines report rewards and step types only; episode returns and lengths are added up
by whoever reads them (`seedacme.accounting.EpisodeTracker`).
"""

from typing import NamedTuple, Sequence

import dm_env
import numpy as np

from seedacme.envs.registry import EnvFactory, EnvSpec, env_spec_of


class BatchStep(NamedTuple):
  """One timestep of K envs, as arrays with a leading K dimension."""
  observation: np.ndarray  # [K, *obs_shape]
  reward: np.ndarray  # float32 [K]; 0 on FIRST steps
  discount: np.ndarray  # float32 [K]; 1 on FIRST steps
  step_type: np.ndarray  # int8 [K]; dm_env.StepType values


class BatchedEnv:
  """Steps K dm_env environments in lockstep, restarting finished episodes."""

  def __init__(self, factory: EnvFactory, num_envs: int, seed: int = 0):
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    self._envs: Sequence[dm_env.Environment] = [
        factory(seed + i) for i in range(num_envs)]
    self.spec: EnvSpec = env_spec_of(self._envs[0])
    self.num_envs = num_envs
    k = num_envs
    self._obs = np.zeros((k,) + self.spec.observation_shape, self.spec.dtype)
    self._reward = np.zeros(k, np.float32)
    self._discount = np.ones(k, np.float32)
    self._step_type = np.zeros(k, np.int8)

  def _write(self, i: int, ts: dm_env.TimeStep) -> None:
    self._obs[i] = ts.observation
    self._reward[i] = 0.0 if ts.reward is None else ts.reward
    self._discount[i] = 1.0 if ts.discount is None else ts.discount
    self._step_type[i] = ts.step_type

  def _batch(self) -> BatchStep:
    return BatchStep(self._obs.copy(), self._reward.copy(), self._discount.copy(),
                     self._step_type.copy())

  def reset(self) -> BatchStep:
    """Starts a new episode in every env."""
    for i, env in enumerate(self._envs):
      self._write(i, env.reset())
    return self._batch()

  def step(self, actions: np.ndarray) -> BatchStep:
    """Applies `actions[i]` to env i (or restarts it if its episode has ended)."""
    actions = np.asarray(actions)
    if actions.shape != (self.num_envs,):
      raise ValueError(
          f'expected {self.num_envs} actions, got an array of shape {actions.shape}')
    for i, env in enumerate(self._envs):
      last = self._step_type[i] == dm_env.StepType.LAST
      self._write(i, env.reset() if last else env.step(actions[i]))
    return self._batch()

  def close(self) -> None:
    for env in self._envs:
      close = getattr(env, 'close', None)
      if close is not None:
        close()
