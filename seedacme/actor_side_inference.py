"""Actor-side inference: the baseline SEED is measured against (Acme's distributed pattern).

With `ProgramConfig.inference = 'actor'` every actor process holds its own copy of the
policy network, runs it on its own K envs, writes its own trajectories to Reverb and
pulls fresh parameters from the learner every `variable_update_period` calls with Acme's
`VariableClient`. Everything else is the program SEED runs: the same builder, policy,
trajectory sink, learner, env engine and actor loop. The pieces are reused as they are:

    EnvActor --step(request)--> ActorSideInference           (in the actor process)
                                  InferenceServer (batch = this actor's K envs)
                                  policy from builder.make_policy
                                  sink from builder.make_trajectory_sink --> Reverb
                                  acme VariableClient <-- CentralNode.get_variables

The central node then only learns. It still owns the program's progress: each actor
sends it `report_acting` records (env steps, finished episodes, batch statistics), which
`ActingReports` turns into the same numbers the central `InferenceServer` gives.
"""

import threading
import time
from concurrent import futures
from typing import Any, Dict, List

from absl import logging
import cloudpickle
import numpy as np

from seedacme import batcher as batcher_lib
from seedacme import protocol
from seedacme.accounting import WIRE_FIELDS, ActingLog, CountsSteps, ActingReport, Episodes, Mode
from seedacme.lifecycle import default_stop_event

POLICY_VARIABLES = 'policy'


class _OffsetSink:
  """Maps global env ids to this actor's 0..K-1 so its sink holds only its own envs."""

  def __init__(self, sink, first_env_id: int):
    self._sink = sink
    self._first = first_env_id

  def add(self, env_ids, step) -> None:
    self._sink.add(np.asarray(env_ids) - self._first, step)

  def reset(self, env_ids) -> None:
    self._sink.reset(np.asarray(env_ids) - self._first)

  def stats(self) -> Dict[str, float]:
    return self._sink.stats()

  def close(self) -> None:
    self._sink.close()


class ActorSideInference:
  """The policy served inside an actor process, for that actor's envs only.

  Has the inference client's interface (`step` and `futures.step`), so `EnvActor`
  drives it exactly as it drives the central node's Courier client.
  """

  def __init__(self, payload: bytes, replay_address: str, central: Any, first_env_id: int,
               num_envs: int, greedy: bool, stop_event: threading.Event,
               report_interval_s: float = 2.0):
    """Builds the network copy, policy and (for training actors) trajectory sink.

    Args:
      payload: cloudpickled `(builder, spec, config)`: kept as bytes until this (actor)
        process so the Launchpad supervisor never imports TensorFlow.
      replay_address: the Reverb server's address.
      central: Courier client of the central node (`get_variables`, `report_acting`).
      first_env_id, num_envs: this actor's global env ids.
      greedy: an evaluator: writes no trajectories.
      stop_event: set when the program stops (ends the wait for first variables).
      report_interval_s: period of `report_acting` calls.
    """
    import reverb  # pylint: disable=g-import-not-at-top
    from acme.tf import variable_utils  # pylint: disable=g-import-not-at-top
    from seedacme.inference import InferenceServer  # pylint: disable=g-import-not-at-top
    builder, spec, config = cloudpickle.loads(payload)
    self._central = central
    self._stop = stop_event
    self._report_interval_s = report_interval_s
    networks = builder.make_networks(spec)
    policy = builder.make_policy(networks, spec, config.num_train_envs, config.num_envs)
    self._sink = None
    if config.train and not greedy:
      self._sink = _OffsetSink(
          builder.make_trajectory_sink(reverb.Client(replay_address), num_envs, spec),
          first_env_id)
    # One caller (this actor): every request is a whole batch; run it at once, whether
    # it holds all K envs or half of them (a half-batch engine).
    self.server = InferenceServer(policy, spec, config.num_envs, self._sink,
                                  max_batch_envs=num_envs, batch_timeout_s=0.0,
                                  batch_capacity=num_envs)
    self._episodes: Dict[Mode, List[Episodes]] = {m: [] for m in Mode}
    self.server.acting.listener = self._on_episodes
    self._variables = builder.policy_network(networks).variables
    actor = self

    class CountingVariableClient(variable_utils.VariableClient):
      """Acme's client; counts the parameter copies it makes."""

      def _copy(self, new_variables):
        super()._copy(new_variables)
        actor.variable_updates += 1

    self.variable_updates = 0
    self._variable_client = CountingVariableClient(
        central, {POLICY_VARIABLES: self._variables},
        update_period=config.variable_update_period)
    self._first_env_id = first_env_id
    self._fetch_first_variables()
    self._reported = (0, 0)
    self._last_report = time.monotonic()
    self._executor = futures.ThreadPoolExecutor(1, thread_name_prefix='actor-inference')
    self.futures = self  # `inference.futures.step(request)` as with a Courier client

  def _fetch_first_variables(self) -> None:
    """Blocks until the learner answers (it may still be starting)."""
    backoff = 0.2
    while not self._stop.is_set():
      try:
        self._variable_client.update_and_wait()
        logging.info('Actor-side inference: got %d variables from the learner',
                     len(self._variables))
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.info('Actor-side inference: waiting for the learner (%s)',
                     str(e).strip().splitlines()[-1][:120])
        self._stop.wait(backoff)
        backoff = min(2 * backoff, 5.0)

  def _on_episodes(self, mode: Mode, episodes: Episodes) -> None:
    self._episodes[mode].append(episodes)

  def _maybe_report(self) -> None:
    now = time.monotonic()
    if now - self._last_report < self._report_interval_s:
      return
    self._last_report = now
    self._central.futures.report_acting(self.take_report())

  def take_report(self) -> Dict[str, Any]:
    """What happened since the last report (the central node sums these)."""
    server = self.server
    steps = (server.env_steps, server.eval_env_steps)
    stats = server.batch_stats(reset=True)
    episodes = {}
    for mode in Mode:
      done, self._episodes[mode] = self._episodes[mode], []
      episodes[mode] = Episodes(*(np.concatenate(x) for x in zip(*done))) if done \
          else Episodes.none()
    acting = ActingReport({Mode.TRAIN: steps[0] - self._reported[0],
                           Mode.EVAL: steps[1] - self._reported[1]}, episodes)
    self._reported = steps
    return {
        'source': self._first_env_id,
        'batches': stats.batches, 'units': stats.units, 'full_batches': stats.full_batches,
        'mean_latency_ms': stats.mean_latency_ms, 'p99_latency_ms': stats.p99_latency_ms,
        'trajectory': server.trajectory_stats(),
        **acting.to_wire(),
    }

  def _serve(self, request: Dict[str, Any]) -> Dict[str, Any]:
    self._variable_client.update()
    reply = self.server.step(request)
    try:
      self._maybe_report()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Actor-side inference: progress report failed: %s', e)
    return reply

  # The inference-client interface EnvActor uses.
  def step(self, request: Dict[str, Any]) -> 'futures.Future[Dict[str, Any]]':
    """Serves one request on this actor's inference thread (variables updated first)."""
    return self._executor.submit(self._serve, request)

  def close(self) -> None:
    self._executor.shutdown(wait=True)
    self.server.shutdown()


def run_actor_with_inference(payload: bytes, replay_address: Any, central: Any,
                             stop_event: threading.Event | None = None,
                             **actor_kwargs) -> None:
  """Entry point of an actor process that runs its own policy copy (`inference='actor'`)."""
  from seedacme.actor import EnvActor  # pylint: disable=g-import-not-at-top
  if stop_event is None:
    stop_event = default_stop_event()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Many actors share few cores: one TF thread each, as env-only actors cap BLAS.
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  if hasattr(replay_address, 'resolve'):
    replay_address = replay_address.resolve()
  inference = ActorSideInference(
      payload, replay_address, central, actor_kwargs['first_env_id'],
      actor_kwargs['num_envs'], actor_kwargs.get('greedy', False), stop_event)
  try:
    EnvActor(inference=inference, stop_event=stop_event, **actor_kwargs).run()
  finally:
    try:
      central.futures.report_acting(inference.take_report())
    except Exception:  # pylint: disable=broad-except
      pass
    inference.close()


class ActingReports(CountsSteps):
  """The central node's view of acting when actors run their own inference.

  Offers what `CentralNode` reads from its `InferenceServer` -- env step counts, the
  episode log, batch statistics -- summed from the actors' `report_acting` calls.
  """

  def __init__(self, envs_per_actor: int):
    self._lock = threading.Lock()
    self.acting = ActingLog()
    self.actor_restarts = 0
    self.requests_refused = 0
    self.max_batch_envs = self.batch_capacity = envs_per_actor
    self._batches = self._units = self._full = 0
    self._latency_sum = 0.0
    self._p99 = float('nan')
    self._trajectory: Dict[int, Dict[str, float]] = {}
    self._closed = False

  def step(self, request: Dict[str, Any]) -> Dict[str, Any]:
    del request
    if self._closed:
      return {'shutting_down': 'the program is stopping'}
    raise protocol.InvalidRequestError(
        "this program runs actor-side inference (inference='actor'): the central node "
        'serves no inference steps')

  def report(self, report: Dict[str, Any]) -> None:
    """Adds one actor's `ActorSideInference.take_report()` (checked by `check_report`)."""
    report = check_report(report)
    source = int(report['source'])
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


  def batch_stats(self, reset: bool = False) -> batcher_lib.BatcherStats:
    with self._lock:
      b = self._batches
      stats = batcher_lib.BatcherStats(
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

  def shutdown(self) -> None:
    """Further `step` calls get a `shutting_down` reply."""
    self._closed = True


def check_report(report: Any) -> Dict[str, Any]:
  """Validates a `report_acting` payload; a malformed one fails only its caller."""
  required = ('source', 'batches', 'units', 'full_batches', 'mean_latency_ms',
              'p99_latency_ms', 'trajectory') + WIRE_FIELDS
  if not isinstance(report, dict):
    raise protocol.InvalidRequestError(
        f'report_acting expects a dict, got {type(report).__name__}')
  missing = [k for k in required if k not in report]
  if missing:
    raise protocol.InvalidRequestError(f'report_acting: missing fields {missing}')
  try:
    ActingReport.from_wire(report)
  except (TypeError, ValueError) as e:
    raise protocol.InvalidRequestError(f'report_acting: {e}') from None
  return report
