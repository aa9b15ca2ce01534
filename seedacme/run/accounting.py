"""The acting account: the one place that counts env steps, episodes and returns.

Envs and actors report what happened -- step types and rewards -- and never keep
running sums of their own. Two small pieces turn that into progress:

* `EpisodeTracker` follows the episode in progress of every env (return and length so
  far; FIRST starts over) and hands back the episodes that a step ended.
* `ActingLog` keeps the totals per `Mode` (training or greedy evaluation): env steps,
  episodes and the recent returns and lengths the run monitor averages; and the env
  faults actors reported (envs that raised or hung), by kind, for the summary.

Who keeps one: the central node (fed by its inference server, or by the reports of
actors that run their own inference), and every actor (its own envs, for its log lines
and evaluation rounds). An actor with its own inference sends the central node deltas
of its log (`take_report`), which the central node adds with `add_report`.

It sits below `serving/` and `actor/` in the import order because both count through it.
"""

import collections
import threading
from typing import Dict, List

import numpy as np

from seedacme.types import FIRST, LAST, Episodes, Mode
from seedacme.wire.reports import ENV_FAULT_KINDS, ActingReport


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
    LAST step ended, in the order of `ids` (`Episodes.ids` says which)."""
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

  def state(self) -> Dict[str, np.ndarray]:
    """Every env's episode in progress (a reproducible run's round checkpoint)."""
    return {'return': self._return.copy(), 'length': self._length.copy()}

  def load_state(self, state: Dict[str, np.ndarray]) -> None:
    """Continues the episodes in progress of `state()` (same number of envs)."""
    if np.shape(state['return']) != self._return.shape:
      raise ValueError(f'episode state of {np.shape(state["return"])} envs; this tracker '
                       f'follows {self._return.shape}')
    self._return[:] = state['return']
    self._length[:] = state['length']


# Episodes the recent averages cover, per mode (the run monitor's targets and the
# learning curves need the same windows).
WINDOWS = {Mode.TRAIN: 100, Mode.EVAL: 20}


class ActingLog:
  """Env steps and finished episodes per `Mode`; averages over the recent episodes.

  Thread-safe: the inference server's batch leader, a report handler and the monitor's
  thread use one log at once.
  """

  def __init__(self, window: int = WINDOWS[Mode.TRAIN],
               eval_window: int = WINDOWS[Mode.EVAL], reporting: bool = False):
    """Averages cover the last `window` training / `eval_window` evaluation episodes.

    `reporting`: keep the episodes ended since the last `take_report` for the next one
    (an actor with its own inference); otherwise only the averaging windows are kept.
    """
    self._lock = threading.Lock()
    sizes = {Mode.TRAIN: window, Mode.EVAL: eval_window}
    self._returns = {m: collections.deque(maxlen=n) for m, n in sizes.items()}
    self._lengths = {m: collections.deque(maxlen=n) for m, n in sizes.items()}
    self._episodes = {m: 0 for m in Mode}
    self._env_steps = {m: 0 for m in Mode}
    # Since the last `take_report`: env steps at that report, episodes ended after it.
    self._reported_steps = {m: 0 for m in Mode}
    self._unreported: Dict[Mode, List[Episodes]] | None = (
        {m: [] for m in Mode} if reporting else None)
    self._env_faults = {kind: 0 for kind in ENV_FAULT_KINDS}

  def add_env_fault(self, kind: str) -> None:
    """Counts one env fault (`seedacme.wire.reports.ENV_FAULT_KINDS`)."""
    with self._lock:
      self._env_faults[kind] += 1

  def env_fault_counts(self) -> Dict[str, int]:
    """Env faults so far, as progress fields: `env_faults_raised`, `env_faults_hung`."""
    with self._lock:
      return {f'env_faults_{kind}': n for kind, n in self._env_faults.items()}

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
      if self._unreported is not None:
        self._unreported[mode].append(episodes)

  def add_report(self, report: ActingReport) -> None:
    for mode in Mode:
      self.add_steps(mode, report.env_steps.get(mode, 0))
      self.add_episodes(mode, report.episodes.get(mode, Episodes.none()))

  def take_report(self) -> ActingReport:
    """What was added since the previous `take_report` (the first: since creation)."""
    if self._unreported is None:
      raise RuntimeError('take_report needs an ActingLog(reporting=True)')
    with self._lock:
      steps = {m: self._env_steps[m] - self._reported_steps[m] for m in Mode}
      self._reported_steps = dict(self._env_steps)
      episodes = {m: Episodes.concatenate(self._unreported[m]) for m in Mode}
      self._unreported = {m: [] for m in Mode}
    return ActingReport(steps, episodes)

  def restore(self, env_steps: int, episodes: int) -> None:
    """Continues a resumed run's training counts (from its checkpoint)."""
    with self._lock:
      self._env_steps[Mode.TRAIN] = int(env_steps)
      self._episodes[Mode.TRAIN] = int(episodes)

  def train_state(self) -> Dict[str, object]:
    """The training counts and the recent returns and lengths (a reproducible run's
    round checkpoint: its round records average over them)."""
    with self._lock:
      return {'env_steps': self._env_steps[Mode.TRAIN],
              'episodes': self._episodes[Mode.TRAIN],
              'returns': list(self._returns[Mode.TRAIN]),
              'lengths': list(self._lengths[Mode.TRAIN])}

  def load_train_state(self, state: Dict[str, object]) -> None:
    """Continues from `train_state()`: counts and the averaging window."""
    with self._lock:
      self._env_steps[Mode.TRAIN] = int(state['env_steps'])
      self._episodes[Mode.TRAIN] = int(state['episodes'])
      for kept, values in ((self._returns, state['returns']),
                           (self._lengths, state['lengths'])):
        kept[Mode.TRAIN].clear()
        kept[Mode.TRAIN].extend(values)

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
