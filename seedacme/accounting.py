"""Acting accounting: the one place that counts env steps, episodes and returns.

Envs and actors report what happened -- step types and rewards -- and never keep
running sums of their own. Two small pieces turn that into progress:

* `EpisodeTracker` follows the episode in progress of every env (return and length so
  far; FIRST starts over) and hands back the episodes that a step ended.
* `ActingLog` keeps the totals per `Mode` (training or greedy evaluation): env steps,
  episodes and the recent returns and lengths the run monitor averages.

The central inference server feeds one `ActingLog` from the requests it serves; with
actor-side inference each actor process accounts its own envs the same way and sends
the central node an `ActingReport` (`seedacme.actor_side_inference`), which feeds the
central node's `ActingLog` through `ActingLog.add_report`. Step types are dm_env's,
as ints (`FIRST`, `MID`, `LAST`), named here once.
"""

import collections
import dataclasses
import enum
import threading
from typing import Callable, Dict, NamedTuple

import dm_env
import numpy as np

FIRST = int(dm_env.StepType.FIRST)
MID = int(dm_env.StepType.MID)
LAST = int(dm_env.StepType.LAST)


class Mode(enum.Enum):
  """What an env's steps are for: training (trajectories) or greedy evaluation."""
  TRAIN = 'train'
  EVAL = 'eval'

  @classmethod
  def of(cls, greedy: bool) -> 'Mode':
    return cls.EVAL if greedy else cls.TRAIN


class Episodes(NamedTuple):
  """Finished episodes: which envs (or slots), their returns and their lengths."""
  ids: np.ndarray  # int64 [N]
  returns: np.ndarray  # float64 [N]
  lengths: np.ndarray  # int64 [N]

  @classmethod
  def none(cls) -> 'Episodes':
    return cls(np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64))


class EpisodeTracker:
  """The episode in progress of each of `num_envs` envs: return and length so far."""

  def __init__(self, num_envs: int):
    self._return = np.zeros(num_envs, np.float64)
    self._length = np.zeros(num_envs, np.int64)

  def forget(self, ids: np.ndarray) -> None:
    """These envs start over (their actor restarted)."""
    self._return[ids] = 0
    self._length[ids] = 0

  def observe(self, ids: np.ndarray, step_type: np.ndarray,
              reward: np.ndarray) -> Episodes:
    """Adds one timestep per env (a FIRST step starts over); returns the episodes a
    LAST step ended."""
    ids = np.asarray(ids)
    first = step_type == FIRST
    self._return[ids] = np.where(first, 0.0, self._return[ids] + reward)
    self._length[ids] = np.where(first, 0, self._length[ids] + 1)
    last = step_type == LAST
    if not last.any():
      return Episodes.none()
    ended = ids[last]
    return Episodes(ended.astype(np.int64), self._return[ended].copy(),
                    self._length[ended].copy())


@dataclasses.dataclass
class ActingReport:
  """What some envs did since the last report, for one `ActingLog` to add up.

  Sent by each actor that runs its own inference (`inference='actor'`), as a dict over
  Courier (`to_wire`, `from_wire`).
  """
  env_steps: Dict[Mode, int]
  episodes: Dict[Mode, Episodes]

  def to_wire(self) -> dict:
    wire = {}
    for mode, (steps_key, episodes_key) in _WIRE.items():
      e = self.episodes.get(mode, Episodes.none())
      wire[steps_key] = int(self.env_steps.get(mode, 0))
      wire[episodes_key] = np.stack([e.returns, e.lengths]).astype(np.float64)
    return wire

  @classmethod
  def from_wire(cls, wire: dict) -> 'ActingReport':
    """Reads `to_wire`'s dict; `ValueError` names the field when it is malformed."""
    steps, episodes = {}, {}
    for mode, (steps_key, episodes_key) in _WIRE.items():
      steps[mode] = int(wire[steps_key])
      value = np.asarray(wire[episodes_key], np.float64)
      if value.ndim != 2 or value.shape[0] != 2:
        raise ValueError(f'{episodes_key} must have shape [2, n] (returns, lengths), '
                         f'got {value.shape}')
      episodes[mode] = Episodes(np.zeros(value.shape[1], np.int64), value[0],
                                value[1].astype(np.int64))
    return cls(steps, episodes)


# Field names of each mode's env steps and episodes ([2, n]: returns, lengths) on the wire.
_WIRE = {Mode.TRAIN: ('env_steps', 'train_episodes'),
         Mode.EVAL: ('eval_env_steps', 'eval_episodes')}
WIRE_FIELDS = tuple(k for keys in _WIRE.values() for k in keys)


class CountsSteps:
  """`env_steps` and `eval_env_steps` of an object that keeps an `ActingLog` as `acting`."""
  acting: 'ActingLog'

  @property
  def env_steps(self) -> int:
    """Training env steps."""
    return self.acting.env_steps(Mode.TRAIN)

  @property
  def eval_env_steps(self) -> int:
    return self.acting.env_steps(Mode.EVAL)


# Episodes the recent averages cover, per mode (the run monitor's targets and the
# learning curves need the same windows).
WINDOWS = {Mode.TRAIN: 100, Mode.EVAL: 20}


class ActingLog:
  """Env steps and finished episodes per `Mode`; averages over the recent episodes."""

  def __init__(self, window: int = WINDOWS[Mode.TRAIN],
               eval_window: int = WINDOWS[Mode.EVAL]):
    """Averages cover the last `window` training / `eval_window` evaluation episodes."""
    self._lock = threading.Lock()
    sizes = {Mode.TRAIN: window, Mode.EVAL: eval_window}
    self._returns = {m: collections.deque(maxlen=n) for m, n in sizes.items()}
    self._lengths = {m: collections.deque(maxlen=n) for m, n in sizes.items()}
    self._episodes = {m: 0 for m in Mode}
    self._env_steps = {m: 0 for m in Mode}
    # Called with every recorded batch of episodes (actor-side inference collects
    # them for its next report).
    self.listener: Callable[[Mode, Episodes], None] | None = None

  def add_steps(self, mode: Mode, count: int) -> None:
    with self._lock:
      self._env_steps[mode] += int(count)

  def add_episodes(self, mode: Mode, episodes: Episodes) -> None:
    if not len(episodes.returns):
      return
    with self._lock:
      self._returns[mode].extend(episodes.returns.tolist())
      self._lengths[mode].extend(episodes.lengths.tolist())
      self._episodes[mode] += len(episodes.returns)
    if self.listener is not None:
      self.listener(mode, episodes)

  def add_report(self, report: ActingReport) -> None:
    for mode in Mode:
      self.add_steps(mode, report.env_steps.get(mode, 0))
      self.add_episodes(mode, report.episodes.get(mode, Episodes.none()))

  def restore(self, env_steps: int, episodes: int) -> None:
    """Continues a resumed run's training counts (from its checkpoint)."""
    with self._lock:
      self._env_steps[Mode.TRAIN] = int(env_steps)
      self._episodes[Mode.TRAIN] = int(episodes)

  def env_steps(self, mode: Mode = Mode.TRAIN) -> int:
    return self._env_steps[mode]

  def episodes(self, mode: Mode = Mode.TRAIN) -> int:
    return self._episodes[mode]

  def summary(self, mode: Mode) -> Dict[str, float]:
    """Episodes so far and the average return and length of the recent ones.

    `average_over` is how many episodes the averages cover: after a resume the total
    `episodes` is restored but the recent returns start over.
    """
    with self._lock:
      r, n = list(self._returns[mode]), list(self._lengths[mode])
      return {'episodes': self._episodes[mode], 'average_over': len(r),
              'average_return': float(np.mean(r)) if r else float('nan'),
              'average_length': float(np.mean(n)) if n else float('nan')}
