"""The central node: inference and learning in one process, one set of variables.

Launchpad runs it as a Courier node. It wires together parts that each have one job:

    acting source   `InferenceServer` (central inference: Courier handler threads call
                    `step`) or `ActingReports` (actor-side inference: actors call
                    `report_acting`); both count acting the same way (`ActingLog`)
    learner loop    `LearnerLoop`: the agent's learner on a background thread
    run monitor     `RunMonitor`: progress records, budgets and targets, the summary
    checkpoints     `Checkpointer` (periodic, at the end, resume) and `export_policy`

`run` is the node's main loop and `shutdown` its one shutdown sequence. Inference and
learning use the same network objects, so inference always runs the latest parameters
and no parameters cross the network.
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
from seedacme.learner_loop import LearnerLoop
from seedacme.lifecycle import default_stop_event
from seedacme.monitor import RunMonitor, StopKind, StopReason
from seedacme.progress import format_line


def make_acting_source(builder: SeedBuilder, networks: Any, spec: EnvSpec,
                       config: ProgramConfig, replay: Any):
  """The central node's side of acting: an `InferenceServer` (central inference, its
  batch step compiled) or `ActingReports` (actors run their own policy copies)."""
  if config.inference != 'central':
    return ActingReports(config.envs_per_actor)
  policy = builder.make_policy(networks, spec, config.num_train_envs, config.num_envs)
  sink = builder.make_trajectory_sink(replay, config.num_envs, spec) if config.train \
      else None
  server = InferenceServer(
      policy, spec, config.num_envs, sink,
      max_batch_envs=config.inference_batch_envs or config.num_train_envs,
      batch_timeout_s=config.inference_timeout_ms / 1e3)
  # Compile the batch sizes every run sees (one actor's request, all actors' requests
  # together) before serving; other sizes compile on first use.
  started = time.monotonic()
  policy.warm_up([config.envs_per_actor, config.num_train_envs])
  logging.info('Inference batch step compiled in %.1fs (device %s)',
               time.monotonic() - started, getattr(policy, 'device', 'host'))
  return server


class CentralNode:
  """Batched inference for all actors + the learner (SEED's accelerator host)."""

  def __init__(self, builder: SeedBuilder, spec: EnvSpec, config: ProgramConfig,
               replay: Any, counter: Any = None,
               stop_program: Callable[[], None] | None = None,
               stop_event: threading.Event | None = None):
    del counter  # no counter node (README, Departures); kept for old programs
    self._builder = builder
    self._config = config
    self._stop_program = stop_program
    self._stop = stop_event
    self._spec = spec
    self.device = compute_device(config.accelerator)  # logs it; refuses a missing one
    self._networks = builder.make_networks(spec)
    self._policy_variables = builder.policy_network(self._networks).variables
    self.server = make_acting_source(builder, self._networks, spec, config, replay)
    self.learner = builder.make_learner(self._networks, replay, spec)
    self.monitor = RunMonitor(config, self.server, replay)
    self.learner_steps = 0  # restored on resume; the learner loop continues from it
    self._checkpointer = None
    self.resumed_from: int | None = None
    if config.checkpoint_interval_s is not None:
      self._checkpointer = Checkpointer(os.path.join(config.logdir, 'checkpoints'),
                                        self.learner.checkpoint_state(),
                                        config.checkpoint_interval_s)
      restored = self._checkpointer.restore()
      if restored is not None:
        self.resumed_from = self.learner_steps = restored['learner_steps']
        self.server.acting.restore(restored['env_steps'], restored['episodes'])
        self.monitor.progress.log_event(
            f'resumed from checkpoint at learner step {self.learner_steps}, env step '
            f'{self.server.acting.env_steps()}')
    self.monitor.restart_clock(self.learner_steps)
    self.loop: LearnerLoop | None = None
    self.stop_reason: StopReason | None = None
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
    return dict(self.monitor.last_record)

  def get_variables(self, names: Sequence[str]) -> List[List[np.ndarray]]:
    """Acme's `VariableSource`: the policy's parameters, for actor-side inference."""
    unknown = [n for n in names if n != POLICY_VARIABLES]
    if unknown:
      raise ValueError(f'unknown variable collections {unknown}; the central node '
                       f'serves {POLICY_VARIABLES!r}')
    return [[v.numpy() for v in self._policy_variables] for _ in names]

  def report_acting(self, report: Dict[str, Any]) -> None:
    """Progress from an actor that runs its own inference (`inference='actor'`)."""
    self.server.report(report)

  # ---- the run -----------------------------------------------------------------------
  def _learner_state(self):
    loop = self.loop
    return (loop.steps, loop.metrics) if loop is not None else (self.learner_steps, {})

  def _counters(self) -> Dict[str, int]:
    return {'learner_steps': self._learner_state()[0],
            'env_steps': self.server.acting.env_steps(),
            'episodes': self.server.acting.episodes(Mode.TRAIN)}

  def _finish_run(self) -> None:
    """At the budget: summary, last checkpoint and the policy as a SavedModel."""
    self.monitor.summarize(*self._learner_state(), self.stop_reason, self.resumed_from)
    if self._checkpointer is not None:
      self._checkpointer.save(self._counters())
    if self._config.export_policy:
      path = os.path.join(self._config.logdir, 'saved_model')
      export_policy(self._builder.policy_network(self._networks), self._spec, path)
      logging.info('Exported the policy to %s', path)

  def run(self) -> None:
    """Trains until the stop event or the budget; then shuts the program down.

    The learner steps in a background thread (`LearnerLoop`). This (main) thread
    reports progress, checkpoints and checks the budget on its own clock.
    """
    if self._stop is None:
      self._stop = default_stop_event()
    c = self._config
    self.loop = loop = LearnerLoop(self.learner, self._stop, c.max_learner_steps,
                                   c.learner_step_delay_s,
                                   should_stop=lambda: self.stop_reason is not None,
                                   steps=self.learner_steps)
    if c.train:
      loop.start()
    next_progress = time.monotonic() + c.progress_interval_s
    try:
      while not self._stop.wait(0.2) and self.stop_reason is None:
        if time.monotonic() >= next_progress or loop.at_max_steps:
          next_progress = time.monotonic() + c.progress_interval_s
          self.stop_reason = self.monitor.report(loop.steps, loop.metrics)
          if self._checkpointer is not None:
            self._checkpointer.maybe_save(self._counters())
        if loop.done.is_set() and not loop.at_max_steps:
          break  # The learner failed.
      if self.stop_reason is not None and self._stop_program is not None:
        # Ask the launcher to stop every node; keep serving until our own stop signal
        # arrives so actors are not left retrying against a closed server.
        logging.info('Budget reached (%s): stopping the program',
                     self.stop_reason.sentence())
        self._finish_run()
        self._stop_program()
        self._stop.wait(60)
    finally:
      self._stop.set()
      if not loop.join(3):
        logging.warning('Learner thread still blocked after 3s; exiting without it')
      elif self._checkpointer is not None and self.stop_reason is None:
        self._checkpointer.save(self._counters())  # Stopped early: keep what was learned.
      reason = self.stop_reason or StopReason(
          StopKind.LEARNER_FAILED if loop.error else StopKind.STOP_REQUESTED)
      final = self.monitor.summarize(*self._learner_state(), reason, self.resumed_from)
      logging.info('Central node stopping (%s): %s', final['stopped_because'],
                   format_line(final))
      self.shutdown()
    if loop.error is not None:
      raise loop.error

  def shutdown(self) -> None:
    """Stops serving and learning, without waiting out timeouts: new requests are
    refused, the trajectory sink closes (a batch blocked on a full table ends at once),
    then the batcher stops and the learner releases its dataset."""
    self.server.shutdown()
    self.learner.close()
