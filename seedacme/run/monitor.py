"""The run monitor: progress records, budgets and targets, the summary and why it stopped.

The central node's main thread asks it for one record per interval. It reads acting
from the node's `ActingLog`, and batching from a `ServingStats`, which both inference
modes' parts implement: the central `InferenceServer` and, with actor-side inference,
the node's `ReportIntake` (it adds up what actors report). It knows nothing about
learning beyond the learner's step count and last metrics, which the caller passes in.

Each record covers the interval since the previous one. The summary (`summarize`,
written once per run) covers the run's steady window instead: its rates run from the
first progress record (start-up -- imports, compiling, actors starting -- excluded) to
the last one (shutdown excluded), and its batch statistics sum every interval's.

Why a run stopped is a `StopReason` with fields (kind, value, threshold): the summary
carries it as `stop` next to the sentence in `stopped_because` that people read.

A reproducible run (`ProgramConfig.reproducible`) also keeps round records
(`round_record`, `<logdir>/rounds.jsonl`): one at the start of every round, written by
the inference server's round gate while acting and learning both wait (so each is a
function of the seed: training env steps, episodes and returns counted in env-id
order, the learner's steps and its metrics at that step; nothing timed). Its learner
and env-step budgets and a training target are checked there, so the run ends at a
round's start whatever the machine's speed; the wall-clock records above still check
the time budget and an evaluation target, and stay as they are. Its evaluator's passes
(`seedacme.serving.evaluation`: each played by one named weights version) go to
`<logdir>/evals.jsonl` (`eval_record`), one line per pass.

Budgets count over the whole run. Env and learner steps are restored with the
checkpoint; the time is the run's clock (`<logdir>/run_clock.json`: seconds of running
over every start, written by rename with each record), which a resumed start continues
(`restart_clock(resumed=True)`) -- before, `max_seconds` started over with every central
process. Records carry both `elapsed_s` (this process) and `run_elapsed_s` (the run).

Why over 300 lines: records, budgets, the run's clock and the summary share the same
windows and counters; split apart, each part would need the others' state.
"""

import dataclasses
import enum
import json
import math
import os
import time
from typing import Any, Dict, List, Protocol

from absl import logging

from seedacme.run.accounting import WINDOWS, ActingLog
from seedacme.run.contacts import actor_status

from seedacme.types import Mode
from seedacme.config import ProgramConfig
from seedacme.run import logdir as logdir_lib
from seedacme.run.progress import ProgressWriter

RUN_CLOCK = 'run_clock.json'
ROUNDS = 'rounds.jsonl'  # a reproducible run's round records
EVALS = 'evals.jsonl'  # a reproducible run's evaluation passes


class StopKind(enum.Enum):
  LEARNER_STEPS = 'learner_steps'  # the learner-step budget
  ENV_STEPS = 'env_steps'  # the env-step budget
  TIME = 'time'  # the time budget (seconds)
  TARGET = 'target'  # the training average return reached the target
  EVAL_TARGET = 'eval_target'  # the greedy evaluator's average return reached it
  LEARNER_FAILED = 'learner_failed'
  # NaN/inf in the loss, or actions no env may take: stops the program, saves no
  # checkpoint over the last good one, and is not restarted.
  DIVERGED = 'diverged'
  STOP_REQUESTED = 'stop_requested'  # a signal (Ctrl-C, the launcher) before any budget


@dataclasses.dataclass(frozen=True)
class StopReason:
  """Why a run stopped: what was measured (`value`) against which limit (`threshold`)."""
  kind: StopKind
  value: float | None = None
  threshold: float | None = None
  detail: str | None = None  # what failed (DIVERGED, LEARNER_FAILED)

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
    if k is StopKind.DIVERGED:
      return f'diverged: {self.detail}'
    if k is StopKind.LEARNER_FAILED:
      return f'learner failed: {self.detail}' if self.detail else 'learner failed'
    return 'stop requested'

  def to_json(self) -> Dict[str, Any]:
    out = {'kind': self.kind.value, 'value': self.value, 'threshold': self.threshold}
    if self.detail is not None:
      out['detail'] = self.detail
    return out

  @property
  def is_budget(self) -> bool:
    """A budget or target was reached (the run ended as planned)."""
    return self.kind not in (StopKind.LEARNER_FAILED, StopKind.STOP_REQUESTED,
                             StopKind.DIVERGED)

  @property
  def ends_program(self) -> bool:
    """The whole program should stop (a planned end, or a run that cannot go on)."""
    return self.is_budget or self.kind is StopKind.DIVERGED


class ServingStats(Protocol):
  """What the monitor reads about serving, whichever side runs the policy. The counters
  count from this process's start (a restarted central node's begin at 0 again)."""
  batch_capacity: int
  actor_restarts: int
  requests_refused: int

  def batch_stats(self, reset: bool = False) -> Any: ...

  def trajectory_stats(self) -> Dict[str, float]: ...


# Episodes the average must cover before a target counts, per watched mode: a full
# window of the acting log's averages.
TARGET_EPISODES = WINDOWS


class _RunBatches:
  """Batch statistics summed over every record's interval (the summary's)."""

  def __init__(self):
    self.batches = self.units = 0
    self.latency_sum = 0.0
    self.p99 = float('nan')

  def add(self, stats: Any) -> None:
    if not stats.batches:
      return
    self.batches += stats.batches
    self.units += stats.units
    self.latency_sum += stats.mean_latency_ms * stats.batches
    # The run's p99 is bounded by its worst interval's: that is what is reported.
    self.p99 = stats.p99_latency_ms if self.p99 != self.p99 else max(self.p99,
                                                                      stats.p99_latency_ms)


class RunMonitor:
  """Progress records (file, TensorBoard), budget and target checks, the summary."""

  def __init__(self, config: ProgramConfig, acting: ActingLog, serving: ServingStats,
               replay: Any = None, progress: ProgressWriter | None = None):
    """`replay`: a Reverb client for table sizes (None: not reported)."""
    self._config = config
    self._acting = acting
    self._serving = serving
    self._replay = replay
    self.progress = progress or ProgressWriter(config.logdir)
    self._start = time.monotonic()
    self._last = (self._start, acting.env_steps(), 0)
    self._steady: tuple | None = None  # (time, env steps, learner steps) at the 1st record
    self._run_batches = _RunBatches()
    self.last_record: Dict[str, Any] = {}
    self._clock_path = os.path.join(config.logdir, RUN_CLOCK)
    self._clock = {'first_start_unix': time.time(), 'elapsed_s': 0.0, 'starts': 1}
    self._elapsed_before = 0.0  # the run's seconds before this process's start
    self._learner_steps_at_start = 0  # `learner_stepped`: has it stepped since?
    self._rounds_path = os.path.join(config.logdir, ROUNDS)
    self._round_lines: List[str] | None = None  # None: rounds.jsonl not started here
    self._evals_path = os.path.join(config.logdir, EVALS)
    self._eval_lines: List[str] | None = None  # None: evals.jsonl not started here
    self._resumed = False
    self.last_round: Dict[str, Any] = {}

  def restart_clock(self, learner_steps: int, resumed: bool = False) -> None:
    """Rates count from here (after a resume: from the restored counters); a resumed
    run's time continues from its clock in the logdir, a fresh one starts at 0."""
    self._start = time.monotonic()
    self._last = (self._start, self._acting.env_steps(), learner_steps)
    self._learner_steps_at_start = learner_steps
    self._resumed = resumed
    saved = None
    if resumed:
      try:
        saved = logdir_lib.read_json(self._clock_path)
      except (OSError, ValueError) as e:  # unreadable: counted from here, and said so
        logging.warning('Cannot read the run clock %s (%s)', self._clock_path, e)
    if saved is not None:
      self._clock = {'first_start_unix': saved['first_start_unix'],
                     'elapsed_s': float(saved['elapsed_s']),
                     'starts': int(saved.get('starts', 1)) + 1}
      self._elapsed_before = self._clock['elapsed_s']
      budget = self._config.time_budget
      self.progress.log_event(
          f"run time so far {self._elapsed_before:.0f}s over {self._clock['starts'] - 1} "
          f'start(s)' + (f'; time budget {budget:.0f}s' if budget is not None else ''))
    else:
      self._clock = {'first_start_unix': time.time(), 'elapsed_s': 0.0, 'starts': 1}
      self._elapsed_before = 0.0
    self._save_clock(self._start)

  def run_elapsed(self, now: float | None = None) -> float:
    """Seconds the run has run, over every start (what the time budget counts)."""
    return self._elapsed_before + ((time.monotonic() if now is None else now) - self._start)

  def _save_clock(self, now: float) -> None:
    self._clock['elapsed_s'] = self.run_elapsed(now)
    try:
      logdir_lib.write_json(self._clock_path, self._clock)
    except Exception as e:  # pylint: disable=broad-except  (progress goes on)
      logging.warning('Cannot write the run clock %s: %s', self._clock_path, e)

  def learner_budget(self, learner_steps: int) -> 'StopReason | None':
    """The learner-step budget, if `learner_steps` reached it (the one place it is
    checked: the learner loop stops stepping on it, and `stop_reason` reports it)."""
    limit = self._config.max_learner_steps
    if limit is not None and learner_steps >= limit:
      return StopReason(StopKind.LEARNER_STEPS, learner_steps, limit)
    return None

  def round_record(self, round_index: int, learner_steps: int,
                   learner_metrics: Dict[str, float]) -> 'StopReason | None':
    """Writes round `round_index`'s record (module docstring) to rounds.jsonl; returns
    the budget or training target it reached (the run then ends before that round)."""
    train = self._acting.summary(Mode.TRAIN)
    record = {'round': round_index, 'env_steps': self._acting.env_steps(Mode.TRAIN),
              'episodes': train['episodes'], 'average_return': train['average_return'],
              'average_length': train['average_length'],
              'average_over': train['average_over'], 'learner_steps': learner_steps,
              **{f'learner_{k}': v for k, v in sorted(learner_metrics.items())}}
    self.last_round = record
    self._write_round(record)
    c = self._config
    if c.max_learner_steps is not None and learner_steps >= c.max_learner_steps:
      return StopReason(StopKind.LEARNER_STEPS, learner_steps, c.max_learner_steps)
    if c.max_env_steps is not None and record['env_steps'] >= c.max_env_steps:
      return StopReason(StopKind.ENV_STEPS, record['env_steps'], c.max_env_steps)
    if c.target_return is not None and c.target_on == 'train' and \
        record['average_over'] >= TARGET_EPISODES[Mode.TRAIN] and \
        record['average_return'] >= c.target_return:
      return StopReason(StopKind.TARGET, record['average_return'], c.target_return)
    return None

  def keep_rounds_before(self, round_index: int) -> int:
    """An exact resume at round `round_index` (`seedacme.run.resume`): rounds.jsonl
    keeps the records before it (the killed run's later ones are written again, as
    the uninterrupted run wrote them); how many it kept."""
    self._round_lines = _keep_records_before(self._rounds_path, 'round', round_index)
    self._resumed = True
    return len(self._round_lines)

  def keep_evals_before(self, pass_index: int) -> int:
    """The evaluator resumed exactly at pass `pass_index` (played or to play):
    evals.jsonl keeps the passes before it; how many."""
    self._eval_lines = _keep_records_before(self._evals_path, 'pass', pass_index)
    self._resumed = True
    return len(self._eval_lines)

  def eval_record(self, record: Dict[str, Any]) -> None:
    """Writes one evaluation pass of a reproducible run to evals.jsonl (its version,
    calls and returns: `seedacme.serving.evaluation`)."""
    self._eval_lines = self._append_line(self._evals_path, self._eval_lines, record)

  def _write_round(self, record: Dict[str, Any]) -> None:
    self._round_lines = self._append_line(self._rounds_path, self._round_lines, record)

  def _append_line(self, path: str, lines: List[str] | None,
                   record: Dict[str, Any]) -> List[str]:
    """One line of a records file (`lines`: what this process wrote to it, None at
    first): appended locally; a remote logdir's file is rewritten whole by rename (it
    cannot be appended to). A fresh run starts the file anew."""
    line = json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                       for k, v in record.items()}) + '\n'
    local = logdir_lib.is_local(self._config.logdir)
    if lines is None:
      lines = []
      if not self._resumed and local:
        with open(path, 'w'):
          pass
    try:
      if local:
        with open(path, 'a') as f:
          f.write(line)
      else:
        lines.append(line)
        logdir_lib.write_atomic(path, ''.join(lines))
    except OSError as e:  # the run goes on; the records are then incomplete, and said so
      logging.warning('Cannot write %s: %s', path, e)
    return lines

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

  def _record(self, learner_steps: int, learner_metrics: Dict[str, float],
              since: tuple, batch: Any, capacity: int, now: float,
              env_steps: int) -> Dict[str, Any]:
    """A record at `now` whose rates run from `since` = (time, env steps, learner
    steps)."""
    t0, env0, learn0 = since
    dt = max(now - t0, 1e-9)
    acting, serving = self._acting, self._serving
    train, evaluation = acting.summary(Mode.TRAIN), acting.summary(Mode.EVAL)
    record = {
        'elapsed_s': now - self._start,
        'run_elapsed_s': self.run_elapsed(now),
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
        'batch_fill': batch.units / batch.batches / capacity if batch.batches else 0.0,
        'latency_ms': batch.latency_ms,
        'latency_p99_ms': batch.p99,
        'actor_restarts': serving.actor_restarts,
        'requests_refused': serving.requests_refused,
        **acting.env_fault_counts(),  # envs that raised or hung (actors' reports)
    }
    record.update(self.actor_status())
    record.pop('transports', None)  # the summary's (`summarize`)
    if self._config.train and 'actors' in record:
      # Actors idle before the learner's first step are start-up, not a fault: the
      # console line says so (`seedacme.run.progress.actors_part`).
      record['learner_stepped'] = learner_steps > self._learner_steps_at_start
    record.update({f'trajectory_{k}': v for k, v in serving.trajectory_stats().items()})
    record.update({f'learner_{k}': v for k, v in learner_metrics.items()})
    return record

  def actor_status(self) -> Dict[str, Any]:
    """How many actors were heard from within a progress interval, through which
    transport, and each replica's transport (`seedacme.run.contacts`); {} when the
    serving side keeps no contacts."""
    contacts = getattr(self._serving, 'contacts', None)
    if contacts is None:
      return {}
    c = self._config
    return actor_status(contacts, c.num_actors, c.envs_per_actor, c.num_eval_envs,
                        within_s=max(c.progress_interval_s, 2.0))

  def record(self, learner_steps: int, learner_metrics: Dict[str, float]) -> Dict[str, Any]:
    """A progress record of everything since the previous one (not written)."""
    now, env_steps = time.monotonic(), self._acting.env_steps()
    stats = self._serving.batch_stats(reset=True)
    self._run_batches.add(stats)
    interval = _Batches(stats.batches, stats.units, stats.mean_latency_ms,
                        stats.p99_latency_ms)
    record = self._record(learner_steps, learner_metrics, self._last, interval,
                          self._serving.batch_capacity, now, env_steps)
    # The window's edges are the moments the counters were read (the replay's
    # stats, read over the network in between, take up to a second under load).
    self._last = (now, env_steps, learner_steps)
    if self._steady is None:
      self._steady = self._last
    return record

  def stop_reason(self, record: Dict[str, Any], learner_steps: int) -> StopReason | None:
    """The budget or target `record` reached, if any (checked in this order). A
    reproducible run's step budgets and training target are its round records'
    (`round_record`): only the time budget and an evaluation target are checked here."""
    c = self._config
    learner = None if c.reproducible else self.learner_budget(learner_steps)
    if learner is not None:
      return learner
    if c.max_env_steps is not None and record['env_steps'] >= c.max_env_steps and \
        not c.reproducible:
      return StopReason(StopKind.ENV_STEPS, record['env_steps'], c.max_env_steps)
    budget, elapsed = c.time_budget, record.get('run_elapsed_s', record['elapsed_s'])
    if budget is not None and elapsed >= budget:
      return StopReason(StopKind.TIME, elapsed, budget)
    if c.target_return is not None and not (c.reproducible and c.target_on == 'train'):
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
    self._save_clock(self._last[0])
    return self.stop_reason(self.last_record, learner_steps)

  def summarize(self, learner_steps: int, learner_metrics: Dict[str, float],
                reason: StopReason, resumed_from: int | None,
                extra: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """Writes `summary.json` (once per run): the run's totals, its rates over the
    steady window (module docstring), why it stopped and where it resumed, and the
    caller's `extra` fields (the final weights' hash, a reproducible run's rounds)."""
    self._run_batches.add(self._serving.batch_stats(reset=True))
    b = self._run_batches
    run = _Batches(b.batches, b.units, b.latency_sum / b.batches if b.batches else
                   float('nan'), b.p99)
    if self._steady is not None and self._last[0] > self._steady[0]:
      start, end = self._steady, self._last  # first to last progress record
    else:  # no interval between records yet: all of the run so far
      start, end = (self._start, *self._last[1:]), None
    final = self._record(learner_steps, learner_metrics, start, run,
                         self._serving.batch_capacity, time.monotonic(),
                         self._acting.env_steps())
    if end is not None:
      dt = end[0] - start[0]
      final['env_steps_per_s'] = (end[1] - start[1]) / dt
      final['learner_steps_per_s'] = (end[2] - start[2]) / dt
    final['steady_window_s'] = (end or (time.monotonic(),))[0] - start[0]
    final.update(self.actor_status())  # with every replica's transport
    final['stopped_because'] = reason.sentence()
    final['stop'] = reason.to_json()
    final['resumed_from_learner_step'] = resumed_from
    final.update(extra or {})
    self._save_clock(time.monotonic())
    self.progress.write_summary(final)
    return final


class _Batches:
  """Batch statistics of some window, in the form `_record` reads."""

  def __init__(self, batches: int, units: int, latency_ms: float, p99: float):
    self.batches, self.units, self.latency_ms, self.p99 = batches, units, latency_ms, p99


def _keep_records_before(path: str, key: str, index: int) -> List[str]:
  """Rewrites the records file `path` with its records whose `key` is below `index`
  (a line torn by a kill dropped); returns its lines."""
  fs = logdir_lib.filesystem(path)
  kept = []
  if fs.exists(path):
    for line in fs.read(path).decode().splitlines(keepends=True):
      try:
        record = json.loads(line)
      except ValueError:  # a line torn by the kill
        continue
      if isinstance(record, dict) and record.get(key, index) < index:
        kept.append(line if line.endswith('\n') else line + '\n')
  logdir_lib.write_atomic(path, ''.join(kept))
  return kept
