"""The shared vocabulary of seedacme: what every part names and none owns.

Env specs (discrete actions, or continuous ones with their bounds: what the wire, the
action heads and the policy's action check read), step types, modes, finished episodes
and the arrays of K envs an actor's engine produces. Every layer imports these (the wire, the server, the actor, the
learner, `envs/`), so this module imports nothing of the package: it sits at the bottom
of the import order (README, "Where things are"). Before it existed `EnvSpec` lived in
`envs/registry.py` and `SlotStep` in `envs/atari_vector.py`, and the core imported
`envs/` while `envs/` imported the core.
"""

import dataclasses
import enum
from typing import Any, Callable, NamedTuple, Tuple

import dm_env
import numpy as np

# Any nest (dict, tuple, list) of arrays or tensors, as dm-tree handles it.
Nest = Any

EnvFactory = Callable[[int], dm_env.Environment]  # factory(seed) -> one environment

# dm_env's step types, as the ints that cross the wire and fill step-type arrays.
FIRST = int(dm_env.StepType.FIRST)
MID = int(dm_env.StepType.MID)
LAST = int(dm_env.StepType.LAST)


class Mode(enum.Enum):
  """What an env's steps are for: training (trajectories) or greedy evaluation.

  Carried by the wire (`seedacme.wire.protocol`: the request's `mode`), set per actor
  (`EnvActor(mode=...)`), handed to the policy as the batch's `Mode.EVAL` mask, and
  keys the acting account (`seedacme.run.accounting.ActingLog`).
  """
  TRAIN = 'train'
  EVAL = 'eval'


@dataclasses.dataclass(frozen=True)
class EnvFactories:
  """Training envs and the evaluator's from two factories (program assembly picks one
  per node, `factory_for`).

  An agent may want options on its training envs that would falsify the evaluator's
  whole-episode returns (e.g. a first episode cut at a random length: agents/registry.py,
  `train_env_defaults`). Called as a factory it makes a training env (spec probes).
  """
  train: EnvFactory
  evaluation: EnvFactory

  def __call__(self, seed: int) -> dm_env.Environment:
    return self.train(seed)


def factory_for(factory: Any, mode: Mode) -> EnvFactory:
  """The factory of `mode`'s envs: `factory` itself unless it is `EnvFactories`."""
  if isinstance(factory, EnvFactories):
    return factory.evaluation if mode == Mode.EVAL else factory.train
  return factory


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What the inference server needs to know about an environment.

  Attributes:
    observation_shape: shape of one observation (no batch dimension).
    observation_dtype: numpy dtype name of observations as they cross the wire.
    num_actions: size of the discrete action space; 0 for continuous actions.
    action_shape: shape of one continuous action (`()` for discrete actions).
    action_minimum, action_maximum: the continuous action's bounds, flat, one per
      action dimension (finite: agents map their squashed actions onto them).
    max_abs_reward: the largest |reward| a request may carry; the server refuses
      more, by name (`seedacme.wire.protocol`). The default, 1e6, is above any
      per-step reward of the envs here (Atari's raw scores, MuJoCo, Football, DMLab)
      and keeps what learners compute from rewards finite in float32: a squared
      TD error of returns up to ~1e8 (1e6 / (1 - 0.99)) stays far below float32's
      3.4e38, where any finite float32 reward (up to 3.4e38) would overflow it.
      An env with larger rewards says so here (`math.inf`: finite is enough).
  """
  observation_shape: Tuple[int, ...]
  observation_dtype: str
  num_actions: int
  action_shape: Tuple[int, ...] = ()
  action_minimum: Tuple[float, ...] = ()
  action_maximum: Tuple[float, ...] = ()
  max_abs_reward: float = 1e6

  def __post_init__(self):
    if not self.max_abs_reward > 0:  # also refuses NaN
      raise ValueError(f'EnvSpec: max_abs_reward must be > 0, got {self.max_abs_reward}')
    if self.action_shape:
      size = int(np.prod(self.action_shape))
      if self.num_actions:
        raise ValueError(f'EnvSpec: num_actions={self.num_actions} with continuous '
                         f'action_shape={self.action_shape}; one or the other')
      if len(self.action_minimum) != size or len(self.action_maximum) != size:
        raise ValueError(f'EnvSpec: action bounds must have {size} values each (action '
                         f'shape {self.action_shape}), got {len(self.action_minimum)} and '
                         f'{len(self.action_maximum)}')
      low, high = np.asarray(self.action_minimum), np.asarray(self.action_maximum)
      if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        raise ValueError(f'EnvSpec: continuous action bounds must be finite with minimum '
                         f'< maximum, got {self.action_minimum} .. {self.action_maximum}')
    elif self.num_actions < 1:
      raise ValueError(f'EnvSpec: a discrete action space needs num_actions >= 1, got '
                       f'{self.num_actions}')

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(self.observation_dtype)

  @property
  def continuous(self) -> bool:
    return bool(self.action_shape)

  @property
  def action_dtype(self) -> np.dtype:
    """int32 action indices, or float32 continuous actions, as they cross the wire."""
    return np.dtype(np.float32 if self.continuous else np.int32)

  @property
  def action_size(self) -> int:
    """Numbers per action: 1 for a discrete action, the flat size of a continuous one."""
    return int(np.prod(self.action_shape)) if self.continuous else 1

  def describe_actions(self) -> str:
    if self.continuous:
      return (f'continuous actions of shape {self.action_shape} in '
              f'[{min(self.action_minimum)}, {max(self.action_maximum)}]')
    return f'{self.num_actions} discrete actions'

  def check_actions(self, action: np.ndarray) -> None:
    """Raises `InvalidActionError` unless `action` ([B, *action_shape]) can go to envs:
    finite, of the right shape, inside the bounds (an index below `num_actions`)."""
    action = np.asarray(action)
    if action.shape[1:] != tuple(self.action_shape):
      raise InvalidActionError(f'actions of shape {action.shape[1:]} per env; the env '
                               f'takes {self.describe_actions()}')
    if self.continuous:
      if not np.isfinite(action).all():
        bad = np.argwhere(~np.isfinite(action))[0]
        raise InvalidActionError(f'the policy produced a non-finite action '
                                 f'{action[tuple(bad)]} (batch row {bad[0]})')
      low = np.reshape(self.action_minimum, self.action_shape)
      high = np.reshape(self.action_maximum, self.action_shape)
      outside = (action < low) | (action > high)
      if outside.any():
        row = int(np.argwhere(outside)[0][0])
        raise InvalidActionError(f'the policy produced an action outside the env\'s bounds '
                                 f'[{min(self.action_minimum)}, {max(self.action_maximum)}]:'
                                 f' {action[row].tolist()} (batch row {row})')
    elif action.size and (action.min() < 0 or action.max() >= self.num_actions):
      raise InvalidActionError(f'the policy produced action indices outside [0, '
                               f'{self.num_actions}): {sorted(set(action.tolist()))[:8]}')


class InvalidActionError(ValueError):
  """A policy's actions cannot go to the env (non-finite, out of bounds, wrong shape)."""


def env_spec_of(env: dm_env.Environment) -> EnvSpec:
  """Reads the `EnvSpec` of a dm_env environment: a discrete action space
  (`DiscreteArray`) or bounded continuous actions (`BoundedArray` of floats)."""
  obs_spec = env.observation_spec()
  action_spec = env.action_spec()
  observation = dict(observation_shape=tuple(int(d) for d in obs_spec.shape),
                     observation_dtype=np.dtype(obs_spec.dtype).name)
  if hasattr(action_spec, 'num_values'):
    return EnvSpec(num_actions=int(action_spec.num_values), **observation)
  if np.issubdtype(np.dtype(action_spec.dtype), np.floating) and \
      hasattr(action_spec, 'minimum'):
    shape = tuple(int(d) for d in action_spec.shape)
    low = np.broadcast_to(action_spec.minimum, shape).astype(np.float64).ravel()
    high = np.broadcast_to(action_spec.maximum, shape).astype(np.float64).ravel()
    return EnvSpec(num_actions=0, action_shape=shape,
                   action_minimum=tuple(float(x) for x in low),
                   action_maximum=tuple(float(x) for x in high), **observation)
  raise ValueError(f'seedacme agents need a discrete action space (DiscreteArray) or '
                   f'bounded float actions (BoundedArray); got {action_spec!r}')


class Episodes(NamedTuple):
  """Finished episodes: which envs (or slots), their returns and their lengths."""
  ids: np.ndarray  # int64 [N]
  returns: np.ndarray  # float64 [N]
  lengths: np.ndarray  # int64 [N]

  @classmethod
  def none(cls) -> 'Episodes':
    return cls(np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64))

  @classmethod
  def concatenate(cls, parts) -> 'Episodes':
    parts = [p for p in parts if len(p.ids)]
    if not parts:
      return cls.none()
    return cls(*(np.concatenate(x) for x in zip(*parts)))


class BatchStep(NamedTuple):
  """One timestep of K envs, as arrays with a leading K dimension."""
  observation: np.ndarray  # [K, *obs_shape]
  reward: np.ndarray  # float32 [K]; 0 on FIRST steps
  discount: np.ndarray  # float32 [K]; 1 on FIRST steps
  step_type: np.ndarray  # int8 [K]; dm_env.StepType values


class SlotStep(NamedTuple):
  """Timesteps of some of an engine's K env slots (a half batch, or all K)."""
  slots: np.ndarray  # int64 [B]: which of the K envs (0..K-1), in the order of `step`
  step: BatchStep  # arrays with leading dimension B
