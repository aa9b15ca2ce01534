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

A reproducible run's round checkpoints save the envs too: `BatchedEnv.snapshot` pickles
each env with its current timestep, `restore` puts them back (`seedacme.run.resume`).

When an env raises, `BatchedEnv` says which one (`EnvError`: its slot and name), and
while it steps, `current_slot` says which env is in a call: the actor reports a fault
by env, and its step watchdog names the env that hung (`seedacme.actor.env_actor`).
"""

import functools
import pickle
from typing import Any, List, Sequence

import dm_env
import numpy as np

from seedacme.types import BatchStep, EnvFactory, EnvSpec, SlotStep, env_spec_of


def env_name(factory: Any, env: Any = None) -> str:
  """A readable name of an env: its class, and the factory's game or level if it has
  one (e.g. 'AtariEnv (Pong)'); the factory's name when there is no env yet."""
  if isinstance(factory, functools.partial):
    detail = factory.keywords.get('level') or factory.keywords.get('game')
    base = getattr(factory.func, '__name__', type(factory.func).__name__)
  else:
    detail = getattr(factory, 'game', None) or getattr(factory, 'level', None)
    base = getattr(factory, '__name__', type(factory).__name__)
  name = type(env).__name__ if env is not None else base
  return f'{name} ({detail})' if detail else name


class EnvSnapshotError(RuntimeError):
  """An engine's envs cannot be saved (an env that does not pickle, an engine without
  `snapshot`): a resume from that round is not exact, and says why."""


class EnvError(RuntimeError):
  """An env of an engine raised: which one (`slot`, `name`) and the error (`__cause__`)."""

  def __init__(self, slot: int, name: str, error: BaseException):
    super().__init__(f'env {slot} ({name}) raised {type(error).__name__}: {error}')
    self.slot, self.name, self.error = slot, name, error


class BatchedEnv:
  """Steps K dm_env environments in lockstep, restarting finished episodes."""

  def __init__(self, factory: EnvFactory, num_envs: int, seed: int = 0):
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    self._envs: Sequence[dm_env.Environment] = [
        factory(seed + i) for i in range(num_envs)]
    self.names = [env_name(factory, env) for env in self._envs]
    self.current_slot: int | None = None  # the env in a reset/step call, if any
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

  def _call(self, i: int, method, *args) -> dm_env.TimeStep:
    """`method(*args)` of env i, named in the error if it raises."""
    self.current_slot = i
    try:
      return method(*args)
    except Exception as e:  # pylint: disable=broad-except
      raise EnvError(i, self.names[i], e) from e
    finally:
      self.current_slot = None

  def reset(self) -> BatchStep:
    """Starts a new episode in every env."""
    for i, env in enumerate(self._envs):
      self._write(i, self._call(i, env.reset))
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
      self._write(i, self._call(i, env.reset) if last else
                  self._call(i, env.step, actions[i]))
    return self._batch()

  def snapshot(self) -> List[bytes]:
    """Per env, its state and its current timestep, pickled (a reproducible run's
    round checkpoint, `seedacme.run.resume`); raises `EnvSnapshotError` naming an env
    that cannot be pickled."""
    blobs = []
    for i, env in enumerate(self._envs):
      try:
        blobs.append(pickle.dumps(
            {'env': env, 'observation': self._obs[i], 'reward': self._reward[i],
             'discount': self._discount[i], 'step_type': self._step_type[i]},
            protocol=pickle.HIGHEST_PROTOCOL))
      except Exception as e:  # pylint: disable=broad-except
        raise EnvSnapshotError(f'env {i} ({self.names[i]}) cannot be pickled: '
                               f'{type(e).__name__}: {e}') from e
    return blobs

  def restore(self, blobs: Sequence[bytes]) -> BatchStep:
    """Continues from `snapshot()`'s blobs (one per env, in slot order): the envs as
    they were, and their timestep then, which it returns."""
    if len(blobs) != self.num_envs:
      raise ValueError(f'{len(blobs)} env snapshots for {self.num_envs} envs')
    for i, blob in enumerate(blobs):
      saved = pickle.loads(blob)
      close = getattr(self._envs[i], 'close', None)
      if close is not None:
        close()
      self._envs[i] = saved['env']
      self._obs[i], self._reward[i] = saved['observation'], saved['reward']
      self._discount[i], self._step_type[i] = saved['discount'], saved['step_type']
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

  def snapshot(self) -> List[bytes]:
    """The engine's envs, pickled (`BatchedEnv.snapshot`); `EnvSnapshotError` when it
    cannot."""
    snapshot = getattr(self._envs, 'snapshot', None)
    if snapshot is None:
      raise EnvSnapshotError(f'engine {type(self._envs).__name__} cannot snapshot its envs')
    return snapshot()

  def restore(self, blobs: Sequence[bytes]) -> None:
    """The engine's envs from `snapshot()`; `recv()` returns their saved timesteps."""
    self._pending = SlotStep(self._slots, self._envs.restore(blobs))

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
