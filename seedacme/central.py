"""The central node: inference server and learner in one process, one set of variables.

Launchpad runs it as a Courier node. Courier handler threads call `step` (inference
for actors); `run` is the learner loop, which also writes progress and enforces the
program's budget. Both use the same network objects, so inference always runs the
latest parameters and no parameters cross the network.
"""

import os
import threading
import time
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import numpy as np

from seedacme.accounting import Mode
from seedacme.actor_side_inference import POLICY_VARIABLES, ActingReports
from seedacme.builder import SeedBuilder
from seedacme.checkpointing import Checkpointer, export_policy
from seedacme.config import ProgramConfig
from seedacme.devices import compute_device
from seedacme.envs.registry import EnvSpec
from seedacme.inference import InferenceServer
from seedacme.lifecycle import default_stop_event
from seedacme.protocol import InvalidRequestError
from seedacme.progress import ProgressWriter, format_line




class CentralNode:
  """Batched inference for all actors + the learner (SEED's accelerator host)."""

  def __init__(self, builder: SeedBuilder, spec: EnvSpec, config: ProgramConfig,
               replay: Any, counter: Any = None,
               stop_program: Callable[[], None] | None = None,
               stop_event: threading.Event | None = None):
    self._builder = builder
    self._config = config
    self._replay = replay
    self._counter = counter
    self._stop_program = stop_program
    self._stop = stop_event
    self._progress = ProgressWriter(config.logdir)
    self.device = compute_device(config.accelerator)  # logs it; refuses a missing one
    self._networks = builder.make_networks(spec)
    self._policy_variables = builder.policy_network(self._networks).variables
    self._sink = None
    if config.inference == 'central':
      policy = builder.make_policy(self._networks, spec, config.num_train_envs,
                                   config.num_envs)
      if config.train:
        self._sink = builder.make_trajectory_sink(replay, config.num_envs, spec)
      self.server = InferenceServer(
          policy, spec, config.num_envs, self._sink,
          max_batch_envs=config.inference_batch_envs or config.num_train_envs,
          batch_timeout_s=config.inference_timeout_ms / 1e3)
      # Compile the batch sizes every run sees (one actor's request, all actors'
      # requests together) before serving; other sizes compile on first use.
      started = time.monotonic()
      policy.warm_up([config.envs_per_actor, config.num_train_envs])
      logging.info('Inference batch step compiled in %.1fs (device %s)',
                   time.monotonic() - started, getattr(policy, 'device', 'host'))
    else:
      # Actors run their own policy copies and report what they did.
      self.server = ActingReports(config.envs_per_actor)
    self.learner = builder.make_learner(self._networks, replay, spec)
    self.learner_steps = 0
    self.last_metrics: Dict[str, float] = {}
    self.last_record: Dict[str, Any] = {}
    self._spec = spec
    self._checkpointer = None
    self.resumed_from: int | None = None
    if config.checkpoint_interval_s is not None:
      self._checkpointer = Checkpointer(os.path.join(config.logdir, 'checkpoints'),
                                        self.learner.checkpoint_state(),
                                        config.checkpoint_interval_s)
      restored = self._checkpointer.restore()
      if restored is not None:
        self.resumed_from = restored['learner_steps']
        self.learner_steps = restored['learner_steps']
        self.server.acting.restore(restored['env_steps'], restored['episodes'])
        self._progress.log_event(f'resumed from checkpoint at learner step '
                                 f'{self.learner_steps}, env step {self.server.env_steps}')
    self._start = time.monotonic()
    self._last = (self._start, self.server.env_steps, self.learner_steps)
    logging.info('Central node ready (%s inference%s): %d envs (%d training), batch of '
                 '%d envs, timeout %.1f ms', config.inference,
                 '' if config.train else ', acting only', config.num_envs,
                 config.num_train_envs, self.server.max_batch_envs,
                 config.inference_timeout_ms)

  # ---- Courier methods -------------------------------------------------------------
  def step(self, request: Dict[str, Any]) -> Dict[str, Any]:
    """Inference for one actor's batch of envs (see `seedacme.protocol`)."""
    return self.server.step(request)

  def progress(self) -> Dict[str, Any]:
    """The latest progress record."""
    return dict(self.last_record)

  def get_variables(self, names: Sequence[str]) -> List[List[np.ndarray]]:
    """Acme's `VariableSource`: the policy's parameters, for actor-side inference."""
    unknown = [n for n in names if n != POLICY_VARIABLES]
    if unknown:
      raise ValueError(f'unknown variable collections {unknown}; the central node '
                       f'serves {POLICY_VARIABLES!r}')
    return [[v.numpy() for v in self._policy_variables] for _ in names]

  def report_acting(self, report: Dict[str, Any]) -> None:
    """Progress from an actor that runs its own inference (`inference='actor'`)."""
    if not isinstance(self.server, ActingReports):
      raise InvalidRequestError('report_acting: this program runs central inference')
    self.server.report(report)

  # ---- learner loop ----------------------------------------------------------------
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

  def _record(self) -> Dict[str, Any]:
    now = time.monotonic()
    t0, env0, learn0 = self._last
    dt = max(now - t0, 1e-9)
    server = self.server
    train, evaluation = server.acting.summary(Mode.TRAIN), server.acting.summary(Mode.EVAL)
    batch = server.batch_stats(reset=True)
    record = {
        'elapsed_s': now - self._start,
        'env_steps': server.env_steps,
        'env_steps_per_s': (server.env_steps - env0) / dt,
        'episodes': train['episodes'],
        'average_return': train['average_return'],
        'average_length': train['average_length'],
        'eval_episodes': evaluation['episodes'],
        'eval_average_return': evaluation['average_return'],
        'learner_steps': self.learner_steps,
        'learner_steps_per_s': (self.learner_steps - learn0) / dt,
        **self._replay_stats(),
        'inference_batches': batch.batches,
        'batch_fill': batch.mean_batch_units / server.batch_capacity,
        'latency_ms': batch.mean_latency_ms,
        'latency_p99_ms': batch.p99_latency_ms,
        'actor_restarts': server.actor_restarts,
        'requests_refused': server.requests_refused,
    }
    record.update({f'trajectory_{k}': v for k, v in server.trajectory_stats().items()})
    record.update({f'learner_{k}': v for k, v in self.last_metrics.items()})
    self._last = (now, server.env_steps, self.learner_steps)
    return record

  def _budget_reached(self, record: Dict[str, Any]) -> str | None:
    c = self._config
    if c.max_learner_steps is not None and self.learner_steps >= c.max_learner_steps:
      return f'reached {c.max_learner_steps} learner steps'
    if c.max_env_steps is not None and record['env_steps'] >= c.max_env_steps:
      return f'reached {c.max_env_steps} env steps'
    if c.max_seconds is not None and record['elapsed_s'] >= c.max_seconds:
      return f'reached the time budget of {c.max_seconds:.0f}s'
    if c.target_return is not None:
      prefix, needed = ('eval_', 20) if c.target_on == 'eval' else ('', 100)
      value = record[f'{prefix}average_return']
      if record[f'{prefix}episodes'] >= needed and value >= c.target_return:
        return f'{prefix}average return {value:.3f} >= target {c.target_return}'
    return None

  def _counters(self) -> Dict[str, int]:
    return {'learner_steps': self.learner_steps, 'env_steps': self.server.env_steps,
            'episodes': self.server.acting.episodes(Mode.TRAIN)}

  def _final_record(self) -> Dict[str, Any]:
    final = self._record()
    final['stopped_because'] = self._budget_reason or (
        'learner failed' if self._learner_error else 'stop requested')
    final['resumed_from_learner_step'] = self.resumed_from
    return final

  def _finish_run(self) -> None:
    """At the budget: summary, last checkpoint and the policy as a SavedModel."""
    self._progress.write_summary(self._final_record())  # rewritten at shutdown
    if self._checkpointer is not None:
      self._checkpointer.save(self._counters())
    if self._config.export_policy:
      path = os.path.join(self._config.logdir, 'saved_model')
      export_policy(self._builder.policy_network(self._networks), self._spec, path)
      logging.info('Exported the policy to %s', path)

  def _learn(self) -> None:
    """The learner loop (a background thread): SGD steps until stopped or at the budget."""
    max_steps = self._config.max_learner_steps
    try:
      started = time.monotonic()
      self.learner.warm_up()  # while actors start and the replay fills
      logging.info('Learner step traced in %.1fs', time.monotonic() - started)
      while not self._stop.is_set() and self._budget_reason is None:
        if max_steps is not None and self.learner_steps >= max_steps:
          break  # The main thread notices the budget at its next check.
        metrics = self.learner.step()
        if metrics is not None:
          self.learner_steps += 1
          self.last_metrics = metrics
          if self._config.learner_step_delay_s:
            self._stop.wait(self._config.learner_step_delay_s)
    except BaseException as e:  # pylint: disable=broad-except
      logging.exception('Learner failed')
      self._learner_error = e
    finally:
      self._learner_done.set()

  def _report(self) -> None:
    """Progress record, periodic checkpoint and budget check (main thread)."""
    self.last_record = self._record()
    self._progress.write(self.last_record)
    if self._checkpointer is not None:
      self._checkpointer.maybe_save(self._counters())
    self._budget_reason = self._budget_reached(self.last_record)

  def run(self) -> None:
    """Trains until the stop event or the budget; then shuts the program down.

    The learner steps in a background thread. This (main) thread reports progress,
    checkpoints and checks the budget on its own clock -- a slow learner step does not
    delay them -- and stays free to run Launchpad's SIGTERM handler even while the
    learner blocks in Reverb.
    """
    if self._stop is None:
      self._stop = default_stop_event()
    self._budget_reason = None
    self._learner_error = None
    self._learner_done = threading.Event()
    learner_thread = threading.Thread(target=self._learn, name='learner', daemon=True)
    if self._config.train:
      learner_thread.start()
    max_steps = self._config.max_learner_steps
    next_progress = time.monotonic() + self._config.progress_interval_s
    try:
      while not self._stop.wait(0.2) and self._budget_reason is None:
        at_max_steps = max_steps is not None and self.learner_steps >= max_steps
        if time.monotonic() >= next_progress or at_max_steps:
          next_progress = time.monotonic() + self._config.progress_interval_s
          self._report()
        if self._learner_done.is_set() and not at_max_steps:
          break  # The learner failed.
      reason = self._budget_reason
      if reason and self._stop_program is not None:
        # Ask the launcher to stop every node; keep serving until our own stop signal
        # arrives so actors are not left retrying against a closed server.
        logging.info('Budget reached (%s): stopping the program', reason)
        self._finish_run()
        self._stop_program()
        self._stop.wait(60)
    finally:
      self._stop.set()
      if self._config.train:
        learner_thread.join(3)
      if learner_thread.is_alive():
        logging.warning('Learner thread still blocked after 3s; exiting without it')
      elif self._checkpointer is not None and not self._budget_reason:
        self._checkpointer.save(self._counters())  # Stopped early: keep what was learned.
      final = self._final_record()
      self._progress.write_summary(final)
      logging.info('Central node stopping (%s): %s', final['stopped_because'],
                   format_line(final))
      # Refuse new requests, then close the sink (a batch blocked on a full table ends
      # at once), then stop the batcher: no waiting out timeouts.
      self.server.stop_intake()
      if self._sink is not None:
        self._sink.close()
      self.server.close()
      self.learner.close()
    if self._learner_error is not None:
      raise self._learner_error

