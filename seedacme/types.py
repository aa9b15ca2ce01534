"""The shared vocabulary of seedacme: what every part names and none owns.

Env specs, step types, modes, finished episodes and the arrays of K envs an actor's
engine produces. Every layer imports these (the wire, the server, the actor, the
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
