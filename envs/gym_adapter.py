"""Gymnasium (>= 1.0) environments as dm_env environments.

Episode ends map to dm_env's conventions: `terminated` gives a LAST step with discount
0; `truncated` (time limit) gives a LAST step with discount 1, so learners bootstrap
from the value of the final observation instead of treating the cut as a terminal state.
"""


import dm_env
from dm_env import specs
import gymnasium
import numpy as np


class GymnasiumEnv(dm_env.Environment):
  """Wraps a gymnasium env with a `Discrete` action space and a `Box` observation space."""

  def __init__(self, env: gymnasium.Env, seed: int | None = None):
    if not isinstance(env.action_space, gymnasium.spaces.Discrete):
      raise ValueError(f'Only Discrete action spaces are supported, got {env.action_space}')
    if not isinstance(env.observation_space, gymnasium.spaces.Box):
      raise ValueError(f'Only Box observation spaces are supported, got {env.observation_space}')
    self._env = env
    self._seed = seed
    self._dtype = (np.float32 if np.issubdtype(env.observation_space.dtype, np.floating)
                   else env.observation_space.dtype)
    self._needs_reset = True

  def reset(self) -> dm_env.TimeStep:
    obs, _ = self._env.reset(seed=self._seed)
    self._seed = None  # Seed only the first episode; later ones follow the RNG.
    self._needs_reset = False
    return dm_env.restart(np.asarray(obs, dtype=self._dtype))

  def step(self, action) -> dm_env.TimeStep:
    if self._needs_reset:
      return self.reset()
    obs, reward, terminated, truncated, _ = self._env.step(int(action))
    obs = np.asarray(obs, dtype=self._dtype)
    reward = float(reward)
    if terminated:
      self._needs_reset = True
      return dm_env.termination(reward, obs)
    if truncated:
      self._needs_reset = True
      return dm_env.truncation(reward, obs)
    return dm_env.transition(reward, obs)

  def observation_spec(self) -> specs.Array:
    return specs.Array(self._env.observation_space.shape, self._dtype, 'observation')

  def action_spec(self) -> specs.DiscreteArray:
    return specs.DiscreteArray(int(self._env.action_space.n), np.int32, name='action')

  def close(self) -> None:
    self._env.close()


def make_gymnasium(env_id: str, seed: int, **make_kwargs) -> GymnasiumEnv:
  """`gymnasium.make(env_id, **make_kwargs)` as a dm_env environment."""
  return GymnasiumEnv(gymnasium.make(env_id, **make_kwargs), seed=seed)
