"""The run monitor: progress records, budgets and targets, the summary and why it stopped.

The central node's main thread asks it for one record per interval. It reads acting
through one interface, `ActingSource`, which both inference modes implement: the
central `InferenceServer` (it counts what it serves) and, with actor-side inference,
`ActingReports` (it adds up what actors report). It knows nothing about learning
beyond the learner's step count and last metrics, which the caller passes in.

Why a run stopped is a `StopReason` with fields (kind, value, threshold): the summary
carries it as `stop` next to the sentence in `stopped_because` that people read.
"""

import dataclasses
import enum
import time
from typing import Any, Dict, Protocol

from seedacme.accounting import WINDOWS, ActingLog, Mode
from seedacme.config import ProgramConfig
from seedacme.progress import ProgressWriter


class StopKind(enum.Enum):
  LEARNER_STEPS = 'learner_steps'  # the learner-step budget
  ENV_STEPS = 'env_steps'  # the env-step budget
  TIME = 'time'  # the time budget (seconds)
  TARGET = 'target'  # the training average return reached the target
  EVAL_TARGET = 'eval_target'  # the greedy evaluator's average return reached it
  LEARNER_FAILED = 'learner_failed'
  STOP_REQUESTED = 'stop_requested'  # a signal (Ctrl-C, the launcher) before any budget


@dataclasses.dataclass(frozen=True)
class StopReason:
  """Why a run stopped: what was measured (`value`) against which limit (`threshold`)."""
  kind: StopKind
  value: float | None = None
  threshold: float | None = None

  def sentence(self) -> str:
    k, v, t = self.kind, self.value, self.threshold
    if k is StopKind.LEARNER_STEPS:
      return f'reached {t:.0f} learner steps'
    if k is StopKind.ENV_STEPS:
      return f'reached {t:.0f} env steps'
    if k is StopKind.TIME:
      return f'reached the time budget of {t:.0f}s'
    if k in (StopKind.TARGET, StopKind.EVAL_TARGET):
      prefix = 'eval_' if k is StopKind.EVAL_TARGET else ''
      return f'{prefix}average return {v:.3f} >= target {t}'
    return 'learner failed' if k is StopKind.LEARNER_FAILED else 'stop requested'

  def to_json(self) -> Dict[str, Any]:
    return {'kind': self.kind.value, 'value': self.value, 'threshold': self.threshold}

  @property
  def is_budget(self) -> bool:
    """A budget or target was reached (the run ended as planned)."""
    return self.kind not in (StopKind.LEARNER_FAILED, StopKind.STOP_REQUESTED)


class ActingSource(Protocol):
  """What the monitor reads about acting, whichever side runs the policy."""
  acting: ActingLog
  batch_capacity: int
  actor_restarts: int
  requests_refused: int

  def batch_stats(self, reset: bool = False) -> Any: ...

  def trajectory_stats(self) -> Dict[str, float]: ...


# Episodes the average must cover before a target counts, per watched mode: a full
# window of the acting log's averages.
TARGET_EPISODES = WINDOWS


class RunMonitor:
  """Progress records (file, TensorBoard), budget and target checks, summaries."""

  def __init__(self, config: ProgramConfig, acting: ActingSource, replay: Any = None,
               progress: ProgressWriter | None = None):
    """`replay`: a Reverb client for table sizes (None: not reported)."""
    self._config = config
    self._acting = acting
    self._replay = replay
    self.progress = progress or ProgressWriter(config.logdir)
    self._start = time.monotonic()
    self._last = (self._start, acting.acting.env_steps(), 0)
    self.last_record: Dict[str, Any] = {}

  def restart_clock(self, learner_steps: int) -> None:
    """Rates count from here (after a resume: from the restored counters)."""
    self._start = time.monotonic()
    self._last = (self._start, self._acting.acting.env_steps(), learner_steps)

  def _replay_stats(self) -> Dict[str, Any]:
    """Size, inserts and samples over all Reverb tables (None when unreachable)."""
    try:
      tables = self._replay.server_info(timeout=1).values()
      return {
          'replay_size': int(sum(t.current_size for t in tables)),
          'replay_inserts': int(sum(t.rate_limiter_info.insert_stats.completed for t in tables)),
          'replay_samples': int(sum(t.rate_limiter_info.sample_stats.completed for t in tables)),
      }
    except Exception:  # pylint: disable=broad-except
      return {'replay_size': None, 'replay_inserts': None, 'replay_samples': None}

  def record(self, learner_steps: int, learner_metrics: Dict[str, float]) -> Dict[str, Any]:
    """A progress record of everything since the previous one (not written)."""
    now = time.monotonic()
    t0, env0, learn0 = self._last
    dt = max(now - t0, 1e-9)
    source = self._acting
    env_steps = source.acting.env_steps()
    train, evaluation = source.acting.summary(Mode.TRAIN), source.acting.summary(Mode.EVAL)
    batch = source.batch_stats(reset=True)
    record = {
        'elapsed_s': now - self._start,
        'env_steps': env_steps,
        'env_steps_per_s': (env_steps - env0) / dt,
        'episodes': train['episodes'],
        'average_return': train['average_return'],
        'average_length': train['average_length'],
        'average_over': train['average_over'],
        'eval_episodes': evaluation['episodes'],
        'eval_average_return': evaluation['average_return'],
        'eval_average_over': evaluation['average_over'],
        'learner_steps': learner_steps,
        'learner_steps_per_s': (learner_steps - learn0) / dt,
        **self._replay_stats(),
        'inference_batches': batch.batches,
        'batch_fill': batch.mean_batch_units / source.batch_capacity,
        'latency_ms': batch.mean_latency_ms,
        'latency_p99_ms': batch.p99_latency_ms,
        'actor_restarts': source.actor_restarts,
        'requests_refused': source.requests_refused,
    }
    record.update({f'trajectory_{k}': v for k, v in source.trajectory_stats().items()})
    record.update({f'learner_{k}': v for k, v in learner_metrics.items()})
    self._last = (now, env_steps, learner_steps)
    return record

  def stop_reason(self, record: Dict[str, Any], learner_steps: int) -> StopReason | None:
    """The budget or target `record` reached, if any (checked in this order)."""
    c = self._config
    if c.max_learner_steps is not None and learner_steps >= c.max_learner_steps:
      return StopReason(StopKind.LEARNER_STEPS, learner_steps, c.max_learner_steps)
    if c.max_env_steps is not None and record['env_steps'] >= c.max_env_steps:
      return StopReason(StopKind.ENV_STEPS, record['env_steps'], c.max_env_steps)
    if c.max_seconds is not None and record['elapsed_s'] >= c.max_seconds:
      return StopReason(StopKind.TIME, record['elapsed_s'], c.max_seconds)
    if c.target_return is not None:
      mode = Mode.EVAL if c.target_on == 'eval' else Mode.TRAIN
      prefix = 'eval_' if mode is Mode.EVAL else ''
      value = record[f'{prefix}average_return']
      # A full window of this run's own episodes: after a resume the episode count is
      # restored but the average starts over (the first episodes to end after a
      # restart are the shortest, in Pong the most one-sided: 3 of them averaged +20).
      if (record[f'{prefix}average_over'] >= TARGET_EPISODES[mode]
          and value >= c.target_return):
        kind = StopKind.EVAL_TARGET if mode is Mode.EVAL else StopKind.TARGET
        return StopReason(kind, value, c.target_return)
    return None

  def report(self, learner_steps: int,
             learner_metrics: Dict[str, float]) -> StopReason | None:
    """Writes a progress record; returns the budget or target it reached, if any."""
    self.last_record = self.record(learner_steps, learner_metrics)
    self.progress.write(self.last_record)
    return self.stop_reason(self.last_record, learner_steps)

  def summarize(self, learner_steps: int, learner_metrics: Dict[str, float],
                reason: StopReason, resumed_from: int | None) -> Dict[str, Any]:
    """Writes `summary.json`: a last record, why the run stopped, where it resumed."""
    final = self.record(learner_steps, learner_metrics)
    final['stopped_because'] = reason.sentence()
    final['stop'] = reason.to_json()
    final['resumed_from_learner_step'] = resumed_from
    self.progress.write_summary(final)
    return final
