"""The central node's intake of acting reports, when actors run their own inference.

With actor-side inference (`ProgramConfig.inference = 'actor'`) each actor sends
`report_acting(report)` (`seedacme.wire.reports`) every few seconds. `ReportIntake`
checks each one, adds its acting delta to the central node's `ActingLog` and sums its
batch statistics and trajectory counters, so the run monitor reads the same numbers it
reads from a central `InferenceServer` (`seedacme.run.monitor.ActingSource`). It lives with the nodes: only the central
node takes reports.

Env faults (an env that raised or hung, `seedacme.wire.reports.env_fault`) come in
reports too, from every actor: they are logged here by name and counted in the acting
log. With central inference the intake is `faults_only`: a report that counts acting
is refused, since the inference server counts it already.

Any authenticated peer can send a report, so nothing is stored or summed before the
whole report passed `check_report` against the program's sources (`ReportSources`)
and the source's rate bound: per source a bucket of env steps that fills at
`MAX_ENV_STEPS_PER_S` per env up to `BURST_S` seconds' worth. State is kept per
acting source only, so it is bounded by the program's actors. A refusal is the
caller's `InvalidRequestError`, counted (`requests_refused`) and logged (at most every
10 s).
"""

import math
import threading
import time
from typing import Any, Callable, Dict

from absl import logging
import numpy as np

from seedacme.run.accounting import ActingLog
from seedacme.run.contacts import EnvContacts
from seedacme.serving.batcher import BatcherStats
from seedacme.types import Mode
from seedacme.wire.protocol import InvalidRequestError
from seedacme.wire.reports import (BURST_S, MAX_ENV_STEPS_PER_S, ActingReport,
                                   ReportSources, check_report)


class ReportIntake:
  """Adds up the actors' `report_acting` calls into one `ActingLog` and batch stats."""

  def __init__(self, acting: ActingLog, envs_per_actor: int, faults_only: bool = False,
               num_envs: int | None = None, num_eval_envs: int = 0,
               max_abs_reward: float = math.inf,
               clock: Callable[[], float] = time.monotonic):
    """`num_envs`: the program's envs, the evaluator's `num_eval_envs` included (also
    says which actors report: `contacts`; default: one actor's and the evaluator's).
    `max_abs_reward`: the program's reward bound (`EnvSpec.max_abs_reward`)."""
    self._lock = threading.Lock()
    if num_envs is None:
      num_envs = envs_per_actor + num_eval_envs
    self.sources = ReportSources((num_envs - num_eval_envs) // envs_per_actor,
                                 envs_per_actor, num_eval_envs, max_abs_reward)
    self.contacts = EnvContacts(num_envs) if num_envs and not faults_only else None
    self._faults_only = faults_only
    self.acting = acting
    self.actor_restarts = 0
    self.requests_refused = 0
    self.max_batch_envs = self.batch_capacity = envs_per_actor
    self._batches = self._units = self._full = 0
    self._latency_sum = 0.0
    self._p99 = float('nan')
    self._clock = clock
    self._acting_sources = self.sources.acting_sources()
    # Per acting source: its sink's counters, and its bucket of env steps (full at start).
    self._trajectory: Dict[int, Dict[str, float]] = {}
    now = clock()
    self._credit = {s: self._capacity(envs) for s, (envs, _) in self._acting_sources.items()}
    self._credit_at = dict.fromkeys(self._acting_sources, now)

  @staticmethod
  def _capacity(envs: int) -> float:
    return envs * MAX_ENV_STEPS_PER_S * BURST_S

  def report(self, report: Dict[str, Any]) -> None:
    """Adds one actor's report; `InvalidRequestError` (to that actor) if malformed or
    implausible; then nothing of it is stored."""
    try:
      self._add(check_report(report, self.sources, acting_allowed=not self._faults_only))
    except InvalidRequestError as e:
      with self._lock:
        self.requests_refused += 1
        refused = self.requests_refused
      # A real actor's report is never refused: say so in this node's log (bounded).
      logging.log_every_n_seconds(logging.WARNING, 'Refused an acting report (%d so '
                                  'far): %s', 10, refused, str(e)[:300])
      raise

  def _spend(self, source: int, report: Dict[str, Any]) -> None:
    """Takes the report's env steps from `source`'s bucket; refuses more than it holds."""
    envs, mode = self._acting_sources[source]
    field = 'eval_env_steps' if mode is Mode.EVAL else 'env_steps'
    now = self._clock()
    credit = min(self._capacity(envs), self._credit[source]
                 + envs * MAX_ENV_STEPS_PER_S * max(0.0, now - self._credit_at[source]))
    steps = report[field]
    if steps > credit:
      raise InvalidRequestError(
          f'report_acting: {field} {steps} from source {source} exceed what its {envs} '
          f'envs can have stepped: at most {int(credit)} now ({MAX_ENV_STEPS_PER_S} '
          f'steps/s per env, bursts of {BURST_S:g} s)')
    self._credit[source], self._credit_at[source] = credit - steps, now

  def _add(self, report: Dict[str, Any]) -> None:
    """Stores a checked report (`check_report`'s canonical form)."""
    source = report['source']
    acting_source = source in self._acting_sources
    if acting_source:
      with self._lock:
        self._spend(source, report)
    for fault in report['env_faults']:
      self.acting.add_env_fault(fault['kind'])
      logging.error('Env fault (%s) reported by %s: env %s, env ids %s, seed %d: '
                    '%s: %r; the actor restarts on new seeds', fault['kind'], fault['actor'],
                    fault['env_name'], fault['env_ids'], fault['seed'],
                    fault['error_type'], fault['message'])
    if self._faults_only or not acting_source:  # env faults alone (`check_report`)
      return
    envs = self._acting_sources[source][0]
    if self.contacts is not None:
      self.contacts.mark(range(source, source + envs), 'actor-side')
    with self._lock:
      batches = report['batches']
      self._batches += batches
      self._units += report['units']
      self._full += report['full_batches']
      if batches:
        self._latency_sum += report['mean_latency_ms'] * batches
        p99 = report['p99_latency_ms']
        self._p99 = p99 if np.isnan(self._p99) else max(self._p99, p99)
      if report['trajectory']:
        self._trajectory[source] = report['trajectory']
    self.acting.add_report(ActingReport.from_wire(report))

  def batch_stats(self, reset: bool = False) -> BatcherStats:
    with self._lock:
      b = self._batches
      stats = BatcherStats(
          batches=b, items=b, units=self._units, full_batches=self._full,
          mean_batch_units=self._units / b if b else 0.0,
          mean_latency_ms=self._latency_sum / b if b else float('nan'),
          p99_latency_ms=self._p99)
      if reset:
        self._batches = self._units = self._full = 0
        self._latency_sum = 0.0
        self._p99 = float('nan')
      return stats

  def trajectory_stats(self) -> Dict[str, float]:
    """The actors' sink counters, summed over actors."""
    with self._lock:
      total: Dict[str, float] = {}
      for stats in self._trajectory.values():
        for k, v in stats.items():
          total[k] = total.get(k, 0) + v
      return total
