"""Names of the environments seedacme knows, and the spec the central node needs."""

import dataclasses
import functools
from typing import Callable, Tuple

import dm_env
import numpy as np

EnvFactory = Callable[[int], dm_env.Environment]


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What the inference server needs to know about an environment.

  Attributes:
    observation_shape: shape of one observation (no batch dimension).
    observation_dtype: numpy dtype name of observations as they cross the wire.
    num_actions: size of the discrete action space.
  """
  observation_shape: Tuple[int, ...]
  observation_dtype: str
  num_actions: int

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(self.observation_dtype)


def env_spec_of(env: dm_env.Environment) -> EnvSpec:
  """Reads the `EnvSpec` of a dm_env environment with a discrete action space."""
  obs_spec = env.observation_spec()
  action_spec = env.action_spec()
  if not hasattr(action_spec, 'num_values'):
    raise ValueError(
        f'seedacme agents need a discrete action space; got {action_spec!r}')
  return EnvSpec(
      observation_shape=tuple(int(d) for d in obs_spec.shape),
      observation_dtype=np.dtype(obs_spec.dtype).name,
      num_actions=int(action_spec.num_values))


def _make_catch(seed: int, rows: int = 10, columns: int = 5) -> dm_env.Environment:
  from seedacme.envs import catch
  return catch.make_catch(seed, rows=rows, columns=columns)


def _make_cartpole(seed: int, max_episode_steps: int = 500) -> dm_env.Environment:
  from seedacme.envs import gym_adapter
  return gym_adapter.make_gymnasium('CartPole-v1', seed,
                                    max_episode_steps=max_episode_steps)


def _make_dmlab(seed: int, level: str = 'explore_goal_locations_small') -> dm_env.Environment:
  from seedacme.envs import dmlab
  return dmlab.make_dmlab(seed, level=level)


def _make_atari(seed: int, game: str = 'Pong', **kwargs) -> dm_env.Environment:
  from seedacme.envs import atari
  return atari.make_atari(seed, game=game, **kwargs)


_FACTORIES = {
    'atari': _make_atari,
    'catch': _make_catch,
    'cartpole': _make_cartpole,
    'dmlab': _make_dmlab,
}
ENV_NAMES = tuple(sorted(_FACTORIES))


def make_factory(name: str, **kwargs) -> EnvFactory:
  """Returns a picklable `factory(seed) -> dm_env.Environment` for `name`."""
  try:
    fn = _FACTORIES[name]
  except KeyError:
    raise ValueError(
        f'Unknown environment {name!r}; known: {", ".join(ENV_NAMES)}') from None
  return functools.partial(fn, **kwargs)
