"""How an actor steps its K environments: the engines' batch interface.

An engine is either *lockstep* (`reset()`, `step(actions)`: all K envs per call) or
*half-batch* (`recv()`, `send(actions)`: some of the K at a time, the rest stepping
meanwhile -- Atari's 'vector_async', envs/atari_vector.py). The actor drives both
through `recv`/`send` (`Lockstep` adapts the first kind). An env factory may bring its
own engine (`factory.make_engine(K, seed)`, e.g. `envs.registry.AtariFactory`);
`make_engine` falls back to `BatchedEnv`. This lives in the core, not `envs/`, because
the actor depends on it and `envs/` depends on the core, never the other way round.

`BatchedEnv` is the plain synchronous engine: a Python loop over K dm_env
environments. An episode that ended on the previous step is restarted on the next
`step` call (the action sent for its LAST step is ignored), so every call returns K
timesteps and the server sees LAST followed by FIRST for each env, as dm_env intends.
Engines report rewards and step types only; episode returns and lengths are added up
by whoever reads them (`seedacme.run.accounting.EpisodeTracker`).
"""

from typing import Any, Sequence

import dm_env
import numpy as np

from seedacme.types import BatchStep, EnvFactory, EnvSpec, SlotStep, env_spec_of


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
    if actions.shape != (self.num_envs,) + tuple(self.spec.action_shape):
      raise ValueError(
          f'expected actions of shape {(self.num_envs,) + tuple(self.spec.action_shape)}'
          f' ({self.num_envs} envs), got an array of shape {actions.shape}')
    for i, env in enumerate(self._envs):
      last = self._step_type[i] == dm_env.StepType.LAST
      self._write(i, env.reset() if last else env.step(actions[i]))
    return self._batch()

  def close(self) -> None:
    for env in self._envs:
      close = getattr(env, 'close', None)
      if close is not None:
        close()


class Lockstep:
  """Drives a lockstep engine (`reset`, `step`) through `recv`/`send`.

  `recv()` returns all K envs (the first call resets them); `send(actions)` steps them.
  """

  def __init__(self, envs: Any):
    self._envs = envs
    self.spec = envs.spec
    self.num_envs = envs.num_envs
    self.batch_size = envs.num_envs
    self._slots = np.arange(envs.num_envs, dtype=np.int64)
    self._pending: SlotStep | None = None

  def recv(self) -> SlotStep:
    """The K current timesteps (reset on the first call)."""
    if self._pending is None:
      return SlotStep(self._slots, self._envs.reset())
    pending, self._pending = self._pending, None
    return pending

  def send(self, actions: np.ndarray) -> None:
    """Steps all K envs; `recv()` returns the result."""
    self._pending = SlotStep(self._slots, self._envs.step(actions))

  def close(self) -> None:
    self._envs.close()


def half_batch_driver(engine: Any) -> Any:
  """`engine` itself if it has `recv`/`send`, else `Lockstep(engine)`."""
  return engine if hasattr(engine, 'recv') else Lockstep(engine)


def make_engine(factory: EnvFactory, num_envs: int, seed: int = 0) -> Any:
  """How an actor steps K envs of `factory`: the factory's own engine if it has one.

  Returns a lockstep engine (`reset`, `step`) or a half-batch engine (`recv`, `send`).
  Factories without `make_engine` get `BatchedEnv`.
  """
  make = getattr(factory, 'make_engine', None)
  if make is not None:
    return make(num_envs, seed)
  return BatchedEnv(factory, num_envs, seed=seed)
