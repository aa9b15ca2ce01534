"""Actor-side inference: the baseline SEED is measured against (Acme's distributed pattern).

With `ProgramConfig.inference = 'actor'` every actor process holds its own copy of the
policy network, runs it on its own K envs, writes its own trajectories to Reverb and
pulls fresh parameters from the learner every `variable_update_period` calls with Acme's
`VariableClient`. Everything else is the program SEED runs: the same builder, policy,
trajectory sink, learner, env engine and actor loop. The pieces are reused as they are:

    EnvActor --futures.step--> ActorSideInference            (in the actor process)
                                  InferenceServer (batch = this actor's K envs)
                                  policy from builder.make_policy
                                  sink from builder.make_trajectory_sink --> Reverb
                                  acme VariableClient <-- CentralNode.get_variables

The central node then only learns. It still owns the program's progress: each actor
sends it `report_acting` records (`seedacme.wire.reports`): the delta of the actor's own
acting account since the last report (`ActingLog.take_report`; the actor counts its envs
as every actor does, the in-actor server counts nothing) with batch statistics, which
the central node's `ReportIntake` adds up into the same numbers a central
`InferenceServer` gives.
"""

import threading
import time
from concurrent import futures
from typing import Any, Dict

from absl import logging
import cloudpickle
import numpy as np

from seedacme.run.accounting import ActingLog
from seedacme.runtime.lifecycle import default_stop_event
from seedacme.types import Mode
from seedacme.wire import courier_guard
from seedacme.wire.reports import POLICY_VARIABLES


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
               num_envs: int, mode: Mode, acting: ActingLog, stop_event: threading.Event,
               report_interval_s: float = 2.0):
    """Builds the network copy, policy and (for training actors) trajectory sink.

    Args:
      payload: cloudpickled `(builder, spec, config)`: kept as bytes until this (actor)
        process so the Launchpad supervisor never imports TensorFlow.
      replay_address: the Reverb server's address.
      central: Courier client of the central node (`get_variables`, `report_acting`).
      first_env_id, num_envs: this actor's global env ids.
      mode: `Mode.EVAL` for an evaluator (writes no trajectories).
      acting: the actor's acting account (`ActingLog(reporting=True)`), which the
        actor feeds; reports are its deltas.
      stop_event: set when the program stops (ends the wait for first variables).
      report_interval_s: period of `report_acting` calls.
    """
    import reverb  # pylint: disable=g-import-not-at-top
    from acme.tf import variable_utils  # pylint: disable=g-import-not-at-top
    from seedacme.serving.server import InferenceServer  # pylint: disable=g-import-not-at-top
    builder, spec, config = cloudpickle.loads(payload)
    self._central = central
    self._stop = stop_event
    self._report_interval_s = report_interval_s
    networks = builder.make_networks(spec)
    policy = builder.make_policy(networks, spec, config.num_train_envs, config.num_envs)
    self._sink = None
    if config.train and mode is Mode.TRAIN:
      self._sink = _OffsetSink(
          builder.make_trajectory_sink(reverb.Client(replay_address), num_envs, spec),
          first_env_id)
    # One caller (this actor): every request is a whole batch; run it at once, whether
    # it holds all K envs or half of them (a half-batch engine).
    self.server = InferenceServer(policy, spec, config.num_envs, self._sink,
                                  max_batch_envs=num_envs, batch_timeout_s=0.0,
                                  batch_capacity=num_envs, acting=None)
    self._acting = acting
    self.variables = builder.policy_network(networks).variables  # the policy copy's
    actor = self

    class CountingVariableClient(variable_utils.VariableClient):
      """Acme's client; counts the parameter copies it makes."""

      def _copy(self, new_variables):
        super()._copy(courier_guard.accept(new_variables, 'actor: the learner\'s variables'))
        actor.variable_updates += 1

    self.variable_updates = 0
    self._variable_client = CountingVariableClient(
        central, {POLICY_VARIABLES: self.variables},
        update_period=config.variable_update_period)
    self._first_env_id = first_env_id
    self._fetch_first_variables()
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
                     len(self.variables))
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.info('Actor-side inference: waiting for the learner (%s)',
                     str(e).strip().splitlines()[-1][:120])
        self._stop.wait(backoff)
        backoff = min(2 * backoff, 5.0)

  def _maybe_report(self) -> None:
    now = time.monotonic()
    if now - self._last_report < self._report_interval_s:
      return
    self._last_report = now
    self._central.futures.report_acting(courier_guard.plain(self.take_report()))

  def take_report(self) -> Dict[str, Any]:
    """What happened since the last report (the central node sums these)."""
    stats = self.server.batch_stats(reset=True)
    return {
        'source': self._first_env_id,
        'batches': stats.batches, 'units': stats.units, 'full_batches': stats.full_batches,
        'mean_latency_ms': stats.mean_latency_ms, 'p99_latency_ms': stats.p99_latency_ms,
        'trajectory': self.server.trajectory_stats(),
        **self._acting.take_report().to_wire(),
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
  from seedacme.actor.env_actor import EnvActor, EnvFaultError, exit_for_env_fault  # pylint: disable=g-import-not-at-top
  if stop_event is None:
    stop_event = default_stop_event()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Many actors share few cores: one TF thread each, as env-only actors cap BLAS.
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  if hasattr(replay_address, 'resolve'):
    replay_address = replay_address.resolve()
  courier_guard.install()  # the central node's replies rebuild no code
  acting = ActingLog(reporting=True)
  inference = ActorSideInference(
      payload, replay_address, central, actor_kwargs['first_env_id'],
      actor_kwargs['num_envs'], actor_kwargs.get('mode', Mode.TRAIN), acting, stop_event)
  fault = None
  try:
    EnvActor(inference=inference, acting=acting, stop_event=stop_event,
             **actor_kwargs).run()
  except EnvFaultError as e:
    fault = e
  finally:
    try:
      central.futures.report_acting(courier_guard.plain(inference.take_report()))
    except Exception:  # pylint: disable=broad-except
      pass
    inference.close()
  if fault is not None:  # reported with the report above; restart on new seeds
    exit_for_env_fault(fault)
