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
"""

import threading
from typing import Any, Dict

from absl import logging
import numpy as np

from seedacme.run.accounting import ActingLog
from seedacme.run.contacts import EnvContacts
from seedacme.serving.batcher import BatcherStats
from seedacme.wire.protocol import InvalidRequestError
from seedacme.wire.reports import ActingReport, check_env_faults, check_report, has_acting


class ReportIntake:
  """Adds up the actors' `report_acting` calls into one `ActingLog` and batch stats."""

  def __init__(self, acting: ActingLog, envs_per_actor: int, faults_only: bool = False,
               num_envs: int | None = None):
    """`num_envs`: the program's envs, to say which actors report (`contacts`)."""
    self._lock = threading.Lock()
    self._envs_per_actor = envs_per_actor
    self.contacts = EnvContacts(num_envs) if num_envs and not faults_only else None
    self._faults_only = faults_only
    self.acting = acting
    self.actor_restarts = 0
    self.requests_refused = 0
    self.max_batch_envs = self.batch_capacity = envs_per_actor
    self._batches = self._units = self._full = 0
    self._latency_sum = 0.0
    self._p99 = float('nan')
    self._trajectory: Dict[int, Dict[str, float]] = {}

  def report(self, report: Dict[str, Any]) -> None:
    """Adds one actor's report; `InvalidRequestError` (to that actor) if malformed."""
    report = check_report(report)
    source = int(report['source'])
    if self._faults_only and has_acting(report):
      raise InvalidRequestError('report_acting: this program runs central inference, '
                                'which counts acting itself; reports carry env faults only')
    for fault in check_env_faults(report.get('env_faults', [])):
      self.acting.add_env_fault(fault['kind'])
      logging.error('Env fault (%s) reported by %s: env %s, env ids %s, seed %d: '
                    '%s: %r; the actor restarts on new seeds', fault['kind'], fault['actor'],
                    fault['env_name'], fault['env_ids'], fault['seed'],
                    fault['error_type'], fault['message'])
    if self._faults_only:
      return
    if self.contacts is not None:
      self.contacts.mark(range(source, source + self._envs_per_actor), 'actor-side')
    with self._lock:
      batches = int(report['batches'])
      self._batches += batches
      self._units += int(report['units'])
      self._full += int(report['full_batches'])
      if batches:
        self._latency_sum += float(report['mean_latency_ms']) * batches
        p99 = float(report['p99_latency_ms'])
        self._p99 = p99 if np.isnan(self._p99) else max(self._p99, p99)
      if report['trajectory']:
        self._trajectory[source] = dict(report['trajectory'])
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
