"""The central node: inference and learning in one process, one set of variables.

Launchpad runs it as a Courier node. It composes parts that each have one job:

    acting log      `ActingLog`: the run's one acting account
    inference       `InferenceServer` (central inference: Courier handler threads call
                    `step`; it counts what it serves into the acting log), or none;
                    with `ShmServer` beside it for same-host actors (shared memory;
                    Courier stays the control plane: `shm_offer`)
    report intake   `ReportIntake` (actor-side inference: actors call `report_acting`;
                    it adds their deltas to the acting log), or none
    placement       `place_networks`: the learner's networks on its devices (several:
                    data-parallel) and inference's, the same objects or a copy on its
                    own device synced after every learner step (`seedacme.nodes.placed`)
    learner loop    `LearnerLoop`: the agent's learner on a background thread
    run monitor     `RunMonitor`: progress records, budgets and targets, the summary
    checkpoints     `Checkpointer` (periodic, at the end, resume) and `export_policy`

`run` is the node's main loop; whatever ends it (a target, a budget, a signal, a failed
learner), it ends in `finish(reason)`, the one end of a run: the learner stops, the
summary is written once, the last checkpoint and the policy export are saved, and the
node stops. Inference and learning use the same network objects, so inference always
runs the latest parameters and no parameters cross the network.

A reproducible run (`ProgramConfig.reproducible`, issue 63) adds a round clock and a
round gate (`seedacme.serving.rounds`): the learner loop notes its steps on the clock,
the inference server's gate waits there at each round's start and then calls
`_on_round`, which writes the round's record (`RunMonitor.round_record`) and ends the
run at the round where a budget or the training target is met (`_run` sees the
server's `round_stop`); the learner loop asks the gate before each step
(`learner_may_step`). With `reproducible_lag` >= 1 inference serves its own copy of
the policy, made the round's weights by the gate at each round's start, while the
learner trains on an earlier round. The summary carries `weights_sha256` (the policy's
variables at the end, in every run) and, for a reproducible run, its rounds and
`exact_until_round` (null: exact throughout; else the last round whose record the
seed alone decided -- an actor restart, a retried request or a resume came after it).
Its evaluator plays in passes, each with one named version of the weights
(`seedacme.serving.evaluation`): the node builds a second copy of the policy for it
(`_make_evaluation`, last, so that the training networks' initial weights are drawn as
without it), writes each pass to `evals.jsonl`, lets the passes that start by the
run's last round finish before it ends (`EVAL_FINISH_S`), and puts the passes in the
summary (`eval_*`). Its checkpoints are round checkpoints (`seedacme.run.resume`):
every `checkpoint_rounds` rounds and at the round it ends, from the round hook
(`_save_round`: the round state, then the TF checkpoint), never on the clock; a resume
continues at the round (`_resume_rounds`), the actors taking their envs back
(`env_snapshot`, `resume_envs` on Courier).

Why ~600 lines: the node composes parts that live elsewhere, but its start-up
(placement, restore and the run-config check) and its one end (`finish`) are ordered
steps that read best in one place. Its start-up phases are marked under the node name
`learner` (`seedacme.runtime.startup`: `devices`, `inference_compiled`, `serving`;
the learner loop marks `learner_traced`).
"""

import dataclasses
import hashlib
import os
import threading
import time
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from seedacme.builder import SeedBuilder
from seedacme.config import ProgramConfig
from seedacme.learner.base import DivergedError
from seedacme.learner.checkpointing import Checkpointer, export_policy
from seedacme.learner.loop import LearnerLoop
from seedacme.nodes.placed import place_networks
from seedacme.nodes.report_intake import ReportIntake
from seedacme.nodes.service import make_central_server
from seedacme.run.accounting import ActingLog
from seedacme.run.identity import run_identity
from seedacme.run.monitor import RunMonitor, StopKind, StopReason
from seedacme.run.progress import format_line
from seedacme.run.resume import (checkpoint_round, continues_exactly, EnvSnapshots,
                                  RoundCheckpoints)
from seedacme.run.schedule import ClockClosedError, RoundClock
from seedacme.runtime import startup
from seedacme.runtime.devices import compute_device
from seedacme.runtime import machine_pins
from seedacme.runtime.placement import split_cpu
from seedacme.runtime.lifecycle import default_stop_event
from seedacme.serving.evaluation import EvalPasses, episodes_per_env
from seedacme.serving.rounds import RoundGate
from seedacme.serving.server import InferenceServer
from seedacme.serving.tf_policy import inference_device
from seedacme.serving.shm_server import ShmServer
from seedacme.types import EnvSpec, Mode
from seedacme.wire.protocol import InvalidRequestError
from seedacme.wire.reports import check_variable_names

# How long a node that asked the launcher to stop the program keeps serving, waiting
# for its own stop signal (actors are not left retrying against a closed server).
PROGRAM_STOP_WAIT_S = 60.0
# How long `finish` waits for the learner's step in flight; the central supervisor's
# grace (`central_process.CENTRAL_STOP_TIMEOUT_S`) leaves room for it and the save.
LEARNER_JOIN_S = 4.0
# A clock checkpoint waits this long for the learner to be between two steps (a step
# holds it for its data wait and its update); longer, and the next tick tries again.
CLOCK_SAVE_WAIT_S = 10.0
# How long a reproducible run's end waits for the evaluator to play the passes that
# start by its last round (`EvalPasses.wait_finished`; the summary says if it did).
EVAL_FINISH_S = 120.0

def weights_sha256(variables: Sequence[Any]) -> str:
  """A hash of `variables`' values in order (dtype, shape and bytes of each): two runs
  that end with the same weights give the same hash."""
  digest = hashlib.sha256()
  for v in variables:
    value = np.ascontiguousarray(v.numpy())
    digest.update(f'{value.dtype.str}{value.shape}'.encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def make_inference_server(builder: SeedBuilder, networks: Any, spec: EnvSpec,
                          config: ProgramConfig, replay: Any,
                          acting: ActingLog, device: str = '',
                          rounds: RoundGate | None = None) -> InferenceServer:
  """Central inference: the agent's batched policy, its batch step compiled (on
  `device`), serving every actor and counting into `acting`; with `rounds`, in the
  reproducible run's rounds."""
  with inference_device(device):
    policy = builder.make_policy(networks, spec, config.num_train_envs, config.num_envs)
  sink = builder.make_trajectory_sink(replay, config.num_envs, spec) if config.train \
      else None
  server = InferenceServer(
      policy, spec, config.num_envs, sink,
      max_batch_envs=config.inference_batch_envs or config.num_train_envs,
      batch_timeout_s=config.inference_timeout_ms / 1e3, acting=acting, rounds=rounds)
  # Compile the batch sizes every run sees (one actor's request, all actors' requests
  # together) before serving; other sizes compile on first use.
  started = time.monotonic()
  policy.warm_up([config.envs_per_actor, config.num_train_envs])
  logging.info('Inference batch step compiled in %.1fs (device %s)',
               time.monotonic() - started, getattr(policy, 'device', 'host'))
  startup.mark('learner', 'inference_compiled')
  return server


class CentralNode:
  """Batched inference for all actors + the learner (SEED's accelerator host)."""

  def __init__(self, builder: SeedBuilder, spec: EnvSpec, config: ProgramConfig,
               replay: Any, stop_program: Callable[[], None] | None = None,
               stop_event: threading.Event | None = None):
    self._builder = builder
    self._config = config
    self._stop_program = stop_program
    self._stop = stop_event
    if config.max_abs_reward is not None:  # the config's bound over the env's
      spec = dataclasses.replace(spec, max_abs_reward=config.max_abs_reward)
    self._spec = spec
    if config.reproducible:  # TF's threads, before its runtime starts
      try:
        machine_pins.pin_tf_threads(config.reproducible_threads)
      except RuntimeError as e:  # started already (the summary's `unpinned` names it)
        logging.warning('reproducible: cannot fix TF intra-op threads at %d here: %s',
                        config.reproducible_threads, e)
    split_cpu(config.logical_cpus)  # before TF lists its devices
    self.device = compute_device(config.accelerator)  # logs it; refuses a missing one
    startup.mark('learner', 'devices')
    # The run seed fixes the initial weights (Sonnet's initializers draw from TF's
    # global seed: two starts of a run built two networks). A reproducible run also
    # makes every op deterministic (probed in TF 2.8.4 on CPU: V-trace and PPO steps,
    # the XLA batch step, Reverb datasets) and trains on whole rounds in env-id order
    # (the builder's `schedule`: seedacme.run.schedule, RoundBatches).
    tf.random.set_seed(config.seed)
    self.clock: RoundClock | None = None
    self.rounds: RoundGate | None = None
    if config.reproducible:
      tf.config.experimental.enable_op_determinism()
      builder.schedule = builder.round_schedule(config.num_train_envs,
                                                lag=config.reproducible_lag)
    placed = place_networks(builder, spec, config)
    self.placement, learner_devices = placed.placement, placed.learner_devices
    self._networks, self._inference_networks = placed.learner, placed.inference
    self._policy_sync = placed.sync
    # A lagged schedule: inference's copy is made the round's weights at each round's
    # start (the learner trains during the round), not after every learner step.
    self._lagged = config.reproducible and config.reproducible_lag > 0
    if config.reproducible:
      self.clock = RoundClock() if config.train else None
      self.rounds = RoundGate(builder.schedule, self.clock, on_round=self._on_round,
                              is_closed=self._rounds_closed,
                              max_learner_steps=config.max_learner_steps,
                              sync_weights=self._policy_sync if self._lagged else None)
    self._policy_variables = builder.policy_network(self._networks).variables
    self.acting = ActingLog()
    self.server: InferenceServer | None = None
    self.intake: ReportIntake | None = None
    self.shm: ShmServer | None = None
    if config.inference == 'central':
      self.server = make_inference_server(builder, self._inference_networks, spec, config,
                                          replay, self.acting, self.placement.inference,
                                          rounds=self.rounds)
      if config.transport != 'courier':
        self.shm = ShmServer(self.server, spec, config.num_envs)
    # Every actor reports env faults; with central inference, nothing else.
    self.intake = ReportIntake(self.acting, config.envs_per_actor,
                               faults_only=self.server is not None,
                               num_envs=config.num_envs, num_eval_envs=config.num_eval_envs,
                               max_abs_reward=spec.max_abs_reward)
    serving = self.server if self.server is not None else self.intake
    with learner_devices.activate():
      self.learner = builder.make_learner(self._networks, replay, spec)
    self.monitor = RunMonitor(config, self.acting, serving, replay)
    self.learner_steps = 0  # restored on resume; the learner loop continues from it
    self._checkpointer = None
    self.resumed_from: int | None = None
    # A reproducible run's round checkpoints (seedacme.run.resume): the round states,
    # the envs' snapshots as actors hand them in, and what a resume continues from.
    self._round_checkpoints: RoundCheckpoints | None = None
    self._env_snapshots: EnvSnapshots | None = None
    # Round states read while choosing the checkpoint to resume, by learner steps: kept
    # for `_resume_rounds` (each read once), then dropped.
    self._round_states: Dict[int, Any] = {}
    # The evaluator's part of round checkpoints: its state and envs at its own call of
    # a checkpoint round's first call number (`_eval_call`, `env_snapshot`), per round.
    self._eval_checkpoints: RoundCheckpoints | None = None
    self._eval_parts: Dict[int, Dict[str, Any]] = {}
    self._eval_parts_lock = threading.Lock()
    self._eval_resumed = False  # restored from one: checked at its first call
    self.resumed_round: int | None = None
    self._resumed_envs: Dict[int, bytes] = {}
    self._envs_handed: set = set()  # envs whose actor took its snapshot (`resume_envs`)
    self._resumed_metrics: Dict[str, float] = {}
    if config.checkpoint_interval_s is not None:
      if self.rounds is not None and self.server is not None and \
          self._keeps_lagged_rounds():
        self._round_checkpoints = RoundCheckpoints(os.path.join(config.logdir,
                                                                'checkpoints'))
        self._env_snapshots = EnvSnapshots(config.num_train_envs)
        self._eval_checkpoints = RoundCheckpoints(os.path.join(config.logdir, 'checkpoints'),
                                                  prefix='eval')
      # A resume is this run or a refusal (seedacme.run.identity): fatal, not retried.
      self._checkpointer = Checkpointer(os.path.join(config.logdir, 'checkpoints'),
                                        self.learner.checkpoint_state(),
                                        config.checkpoint_interval_s,
                                        identity=run_identity(builder, spec, config),
                                        allow_changes=config.allow_config_change,
                                        log_event=self.monitor.progress.log_event)
      # A reproducible run resumes from its newest checkpoint with every env's state:
      # a run ended by a budget off a checkpoint round saved its last one without them.
      restored = self._checkpointer.restore(
          prefer=None if self._round_checkpoints is None else self._continues_exactly)
      if restored is not None:
        self.resumed_from = self.learner_steps = restored['learner_steps']
        self.acting.restore(restored['env_steps'], restored['episodes'])
        self.monitor.progress.log_event(
            f'resumed from checkpoint at learner step {self.learner_steps}, env step '
            f'{self.acting.env_steps()}')
    if self._policy_sync is not None:  # inference's copy: the restored (or first) weights
      self._policy_sync()
    if self.rounds is not None and self.resumed_from is not None:
      self._resume_rounds(replay)
    if self.clock is not None:
      self.clock.note_learner_steps(self.learner_steps)
    self.monitor.restart_clock(self.learner_steps, resumed=self.resumed_from is not None)
    self.evaluation: EvalPasses | None = None
    if self.rounds is not None and self.server is not None and config.num_eval_envs:
      self.evaluation = self._make_evaluation()
      if self._eval_checkpoints is not None:
        self.server.on_eval_call = self._eval_call
      if self.resumed_round is not None:
        self._resume_evaluation(self.resumed_round)
    if config.env_not_exact and self.rounds is not None:  # the envs', from the start
      self.rounds.not_exact(f'the envs: {config.env_not_exact}', 0)
      if self.evaluation is not None:
        self.evaluation.not_exact(f'the envs: {config.env_not_exact}')
    self.loop: LearnerLoop | None = None
    self.stop_reason: StopReason | None = None  # set once, by `finish`
    self.summary: Dict[str, Any] | None = None
    self._finish_lock = threading.Lock()
    self._closing = False
    self._courier = None  # set when Launchpad's `CourierNode` hosts this node
    logging.info('Central node ready (%s inference%s): %d envs (%d training), batch of '
                 '%d envs, timeout %.1f ms', config.inference,
                 '' if config.train else ', acting only', config.num_envs,
                 config.num_train_envs, serving.max_batch_envs,
                 config.inference_timeout_ms)

  def _keeps_lagged_rounds(self) -> bool:
    """With a lag L, a round's start leaves the L rounds before it in the queue for the
    learner: the trajectory sink keeps their L x N unrolls for the round state (and a
    resume writes them again). False: it cannot, so no round checkpoints (a resume is
    then recorded as not exact)."""
    lag = self._config.reproducible_lag
    sink = self.server.trajectory_sink
    if not lag or sink is None:
      return True
    try:
      sink.keep_recent(lag * self._config.num_train_envs)
    except NotImplementedError as e:
      logging.warning('reproducible_lag=%d: no round checkpoints (%s)', lag, e)
      return False
    return True

  def _continues_exactly(self, learner_steps: int) -> bool:
    """Whether the round state saved at `learner_steps` resumes exactly (the
    checkpointer's `prefer`); keeps what it read."""
    state = self._round_checkpoints.find(learner_steps)
    self._round_states[learner_steps] = state
    return continues_exactly(state)

  def _resume_rounds(self, replay: Any) -> None:
    """A reproducible run resumed: from the round state saved with the checkpoint
    (`seedacme.run.resume`), exactly at its round -- or, without one, with rounds
    counted from the restored learner and the run not exact from round 0 on."""
    state = None
    if self._round_checkpoints is not None:
      state = self._round_states.pop(self.learner_steps, None) or \
          self._round_checkpoints.find(self.learner_steps)
      self._round_states.clear()
    if state is None:
      # A wall-clock checkpoint (a run that was not reproducible, or older code): the
      # acting state (envs, noise, episode windows) is not in it.
      self.rounds.resume_at(self.learner_steps)
      self.rounds.not_exact(f'resumed from a checkpoint at learner step '
                            f'{self.learner_steps} without a round state (acting state '
                            'not saved)', 0)
      return
    r = state['round']
    self.server.restore_round_state(state['server'])
    self.learner.load_resume_state(state['learner'])
    self._resumed_metrics = dict(state['metrics'])
    self._resumed_envs = dict(state['envs'])
    self.resumed_round = r
    kept = self.monitor.keep_rounds_before(r)
    # Unrolls the killed run wrote after this round's start would be taken as this
    # round's: the queue starts empty (an exact resume rewrites them).
    reset = getattr(replay, 'reset', None)
    if reset is not None:
      try:
        reset(self._builder.table)
      except Exception as e:  # pylint: disable=broad-except
        self.rounds.not_exact(f'resumed at round {r}: the replay table could not be '
                              f'emptied ({type(e).__name__}: {e})', r)
    # A lag L: the L rounds of unrolls the learner had yet to take, in their order.
    sink = self.server.trajectory_sink
    rewritten = sink.rewrite_recent() if sink is not None else 0
    wanted = self._config.reproducible_lag * self._config.num_train_envs
    if rewritten != wanted:
      self.rounds.not_exact(f'resumed at round {r}: {rewritten} unrolls of the rounds '
                            f'before it saved for the learner, {wanted} wanted', r)
    missing = state['server']['missing']
    if missing:
      self.rounds.not_exact(f'resumed at round {r}: the server could not save its '
                            f'{", ".join(missing)}', r)
    if state['envs_missing']:
      self.rounds.not_exact(f'resumed at round {r}: {state["envs_missing"]}', r)
    self.monitor.progress.log_event(
        f'resumed at round {r} (learner step {self.learner_steps}; rounds.jsonl keeps '
        f'its {kept} records before it)' + ('' if self.rounds.exact_until_round is None
                                           else ', not exact: ' +
                                           self.rounds.not_exact_because))

  def _save_round(self, round_index: int) -> None:
    """A round checkpoint at round `round_index`'s start (from the round hook: acting
    and learning both wait): the round state, then the TF checkpoint."""
    blobs, why = self._env_snapshots.take(round_index)
    learner_steps, metrics = self._learner_state()
    state = {'round': round_index, 'learner_steps': learner_steps,
             'metrics': dict(metrics), 'server': self.server.round_state(),
             'learner': self.learner.resume_state(), 'envs': blobs, 'envs_missing': why}
    started = time.monotonic()
    self._round_checkpoints.write(round_index, state)
    path = self._checkpointer.save(self._counters())
    logging.info('Round %d checkpoint %s (%.2fs)%s', round_index, path,
                 time.monotonic() - started, f'; not exact from it: {why}' if why else '')

  # ---- a reproducible run's envs across a resume (`seedacme.run.resume`) ------------
  def env_snapshot(self, *args) -> None:
    """(round, env ids, blobs or None, why): an actor's envs at a checkpoint round's
    first call (pickled, kept as bytes: never unpickled here), or why it has none."""
    if len(args) not in (3, 4):
      raise InvalidRequestError(f'env_snapshot takes (round, env_ids, blobs[, why]), '
                                f'got {len(args)} arguments')
    round_index, env_ids, blobs = args[:3]
    why = args[3] if len(args) == 4 else None
    if type(round_index) is not int or round_index < 1 or \
        not isinstance(env_ids, (list, tuple)) or \
        any(type(i) is not int for i in env_ids) or \
        not (blobs is None or isinstance(blobs, (list, tuple))) or \
        not (why is None or isinstance(why, str)):
      raise InvalidRequestError('env_snapshot: expected (round >= 1, [env ids], [bytes] '
                                'or None, why or None)')
    if self._env_snapshots is None:
      return
    first_eval, n = self._config.num_train_envs, self._config.num_envs
    if env_ids and all(first_eval <= i < n for i in env_ids):  # the evaluator's
      if sorted(env_ids) != list(range(first_eval, n)) or (blobs is not None and (
          len(blobs) != len(env_ids) or not all(isinstance(b, bytes) for b in blobs))):
        raise InvalidRequestError(f'env_snapshot: the evaluator\'s envs are {first_eval}..'
                                  f'{n - 1}, all at once, each as bytes')
      self._eval_part(round_index, envs=None if blobs is None else dict(zip(env_ids, blobs)),
                      envs_missing=why and why[:1000])
      return
    try:
      self._env_snapshots.offer(round_index, env_ids, blobs, why and why[:1000])
    except ValueError as e:
      raise InvalidRequestError(f'env_snapshot: {e}') from None

  def resume_envs(self, *args) -> Dict[str, Any] | None:
    """(env ids): for an actor (or the evaluator) starting, its envs' snapshots at the
    round this run resumed at, if they were saved and none of them has been served
    since (else None: it starts its envs anew, and a mid-run restart is recorded as
    one)."""
    if len(args) != 1 or not isinstance(args[0], (list, tuple, np.ndarray)) or \
        any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) for i in args[0]):
      raise InvalidRequestError('resume_envs takes one list of env ids')
    ids = np.asarray(args[0], np.int64)
    if self.resumed_round is None or self.server is None or not ids.size or \
        ids.min() < 0 or ids.max() >= self._config.num_envs or \
        not self.server.restored_envs(ids).all() or \
        any(int(i) not in self._resumed_envs for i in ids):
      return None
    self._envs_handed.update(ids.tolist())
    return {'round': self.resumed_round,
            'call': self.rounds.schedule.first_call(self.resumed_round),
            'blobs': [self._resumed_envs[int(i)] for i in ids]}

  # ---- the evaluator across a resume (`seedacme.run.resume`) --------------------------
  def _eval_call(self, calls: int, env_ids: np.ndarray) -> None:
    """The server's hook before each evaluator call: at a checkpoint round's first call
    number, the evaluator's passes and the eval policy's state of its envs."""
    if self._eval_resumed:  # its first call since an exact resume: its envs came back?
      self._eval_resumed = False
      fresh = sorted(set(env_ids.tolist()) - self._envs_handed)
      if fresh:
        self.evaluation.not_exact(f'resumed: the evaluator\'s envs {fresh[:16]} did not '
                                  'come back to it (started anew)')
    r = checkpoint_round(calls, self.rounds.schedule.unroll_length,
                         self._config.checkpoint_rounds)
    if r is not None:
      self._eval_part(r, passes=self.evaluation.state(),
                      policy=self._eval_policy.acting_state(env_ids))

  def _eval_part(self, round_index: int, **part: Any) -> None:
    """Part of the evaluator's state at round `round_index`'s first call number; once
    its envs (or why not) and the server's side are both in, written beside the round
    checkpoint (`eval-<r>.pkl`)."""
    with self._eval_parts_lock:
      got = self._eval_parts.setdefault(round_index, {})
      got.update(part)
      if 'passes' not in got or 'envs' not in got:
        return
      del self._eval_parts[round_index]
      for r in [r for r in self._eval_parts if r < round_index]:
        del self._eval_parts[r]
    self._eval_checkpoints.write(round_index, dict(got, round=round_index))

  def _resume_evaluation(self, r: int) -> None:
    """An exact resume at round `r`: the evaluator continues from its state at its own
    call `first_call(r)`, envs included, if that was saved (it had reached the round);
    else its passes go on from that call with envs started over, marked not exact."""
    part = None if self._eval_checkpoints is None else self._eval_checkpoints.read(r)
    first_call = self.rounds.schedule.first_call(r)
    if part is None or part['envs'] is None:
      self.evaluation.calls = first_call
      if part is None:
        why = 'its state at the round was not saved (it had not reached the round)'
      else:
        why = f"its envs' snapshot failed: {part['envs_missing'] or 'not said'}"
      self.evaluation.not_exact(f'resumed at round {r}: the evaluator starts over: {why}')
      return
    ids = np.arange(self._config.num_train_envs, self._config.num_envs)
    self.evaluation.load_state(part['passes'])
    self._eval_policy.load_acting_state(ids, part['policy'])
    self.server.mark_restored(ids)
    self._resumed_envs.update(part['envs'])
    self._eval_resumed = True
    kept = self.monitor.keep_evals_before(len(part['passes']['records']))
    logging.info('Reproducible evaluator resumed at its call %d (pass %d; evals.jsonl '
                 'keeps %d)', first_call, len(part['passes']['records']), kept)

  def _make_evaluation(self) -> EvalPasses:
    """A reproducible run's evaluator: a second copy of the policy (its variables
    loaded from a round's copy at each pass start), compiled for the evaluator's batch,
    and the passes (`seedacme.serving.evaluation`). Made after everything else: building
    a network draws its initial weights from TensorFlow's seeded sequence."""
    builder, spec, c = self._builder, self._spec, self._config
    device = self.placement.inference
    with tf.device(device):
      networks = builder.make_networks(spec)
    with inference_device(device):
      policy = builder.make_policy(networks, spec, c.num_train_envs, c.num_envs)
    live = list(builder.policy_network(self._inference_networks).variables)
    copy = list(builder.policy_network(networks).variables)
    if [v.shape for v in live] != [v.shape for v in copy]:
      raise RuntimeError('the evaluator\'s copy of the policy does not match the policy')

    def capture():  # on the round gate's thread: the round's weights, to the host
      return [np.array(v.numpy(), copy=True) for v in live]

    def load(values):  # on the evaluator's thread, between its calls
      for v, value in zip(copy, values):
        v.assign(value)

    evaluation = EvalPasses(
        builder.schedule, c.num_eval_envs, episodes_per_env(c.eval_episodes,
                                                            c.num_eval_envs),
        capture, load, on_pass=self.monitor.eval_record, is_closed=self._rounds_closed)
    policy.warm_up([c.num_eval_envs])
    self._eval_policy = policy
    self.server.evaluate_with(evaluation, policy)
    logging.info('Reproducible evaluator: passes of %d episodes per env on its own copy '
                 'of the policy', evaluation.episodes)
    return evaluation

  def set_courier_server(self, server) -> None:
    """Launchpad's `CourierNode` hook: serve `PUBLIC_METHODS` on its port instead of
    the server it built (which binds every public method); `run` starts and stops it."""
    self._courier = make_central_server(self, port=server.port,
                                        thread_pool_size=server._thread_pool_size)  # pylint: disable=protected-access

  # ---- Courier methods (`PUBLIC_METHODS`, served through `CentralService`) -----------
  def step(self, request: Dict[str, Any]) -> Dict[str, Any]:
    """Inference for one actor's batch of envs (see `seedacme.wire.protocol`)."""
    if self.server is None:
      if self._closing:
        return {'shutting_down': 'the program is stopping'}
      raise InvalidRequestError(
          "this program runs actor-side inference (inference='actor'): the central "
          'node serves no inference steps')
    return self.server.step(request)

  def shm_offer(self, pid: int | None = None) -> Dict[str, Any] | None:
    """How the same-host actor process `pid` attaches to shared memory, its ticket
    bound to `pid` (None: not offered; `{'closing': True}` while the node stops)."""
    if self.shm is None:
      return None
    return {'closing': True} if self._closing else self.shm.offer(pid)

  def progress(self) -> Dict[str, Any]:
    """The latest progress record."""
    return dict(self.monitor.last_record)

  def get_variables(self, names: Sequence[str]) -> List[List[np.ndarray]]:
    """Acme's `VariableSource`: the policy's parameters, for actor-side inference;
    each collection once (`check_variable_names` bounds the request and the reply)."""
    return [[v.numpy() for v in self._policy_variables]
            for _ in check_variable_names(names)]

  def report_acting(self, report: Dict[str, Any]) -> None:
    """Progress from an actor that runs its own inference (`inference='actor'`); env
    faults from any actor (`seedacme.wire.reports`)."""
    self.intake.report(report)

  # ---- the run -----------------------------------------------------------------------
  def _learner_state(self):
    loop = self.loop
    return (loop.steps, loop.metrics) if loop is not None else \
        (self.learner_steps, self._resumed_metrics)

  def _counters(self) -> Dict[str, int]:
    return {'learner_steps': self._learner_state()[0],
            'env_steps': self.acting.env_steps(),
            'episodes': self.acting.episodes(Mode.TRAIN)}

  def run(self) -> None:
    """Trains until a target, a budget, the stop event or a learner failure; then
    `finish`es the run.

    The learner steps in a background thread (`LearnerLoop`). This (main) thread
    reports progress, checkpoints and checks the budgets on its own clock.
    """
    if self._stop is None:
      self._stop = default_stop_event()
    if self._courier is not None:
      self._courier.Start()
      startup.mark('learner', 'serving')
      try:
        self._run()
      finally:
        self._courier.Stop()
        self._courier.Join()
    else:
      self._run()

  def _run(self) -> None:
    c = self._config
    self.loop = loop = LearnerLoop(
        self.learner, self._stop, c.learner_step_delay_s,
        should_stop=lambda steps: (self.stop_reason is not None
                                   or self.monitor.learner_budget(steps) is not None),
        steps=self.learner_steps,
        after_step=None if self._lagged else self._policy_sync, clock=self.clock,
        may_step=self._learner_may_step if self.rounds is not None else None)
    loop.metrics = dict(self._resumed_metrics)  # a resumed round's record carries them
    if c.train:
      loop.start()
    next_progress = time.monotonic() + c.progress_interval_s
    reason = None
    try:
      while reason is None and not self._stop.wait(0.2):
        # A reproducible run's learner stops at its budget before the round gate ends
        # the run at the next round's start (`round_stop`): not a failure.
        learner_ended = loop.done.is_set() and (loop.error is not None
                                                or self.rounds is None)
        if time.monotonic() >= next_progress or learner_ended:
          next_progress = time.monotonic() + c.progress_interval_s
          reason = self.monitor.report(loop.steps, loop.metrics)
          # A reproducible run checkpoints at rounds only (`_on_round`).
          if reason is None and self._checkpointer is not None and \
              self._round_checkpoints is None and self._checkpointer.due():
            with loop.between_steps(CLOCK_SAVE_WAIT_S) as held:
              if held:
                self._checkpointer.save(self._counters())
              else:
                logging.info('Checkpoint deferred: the learner has been in one step '
                             'for over %.0fs', CLOCK_SAVE_WAIT_S)
        if reason is None and self.server is not None and self.server.policy_error:
          reason = StopReason(StopKind.DIVERGED, detail=self.server.policy_error)
        if reason is None and self.server is not None:
          reason = self.server.round_stop  # a reproducible run ends at a round's start
          if reason is not None and self.evaluation is not None:
            self._finish_evaluation()
        if reason is None and learner_ended:
          reason = self._learner_failure(loop.error)
    finally:
      if reason is None:
        reason = self._learner_failure(loop.error) if loop.error else \
            StopReason(StopKind.STOP_REQUESTED)
      self.finish(reason)
    if loop.error is not None and reason.kind is not StopKind.DIVERGED:
      raise loop.error

  def _finish_evaluation(self) -> None:
    """The run ended at a round's start: the evaluator plays the passes that start by
    that round (boundedly: `EVAL_FINISH_S`; a stop signal ends the wait)."""
    started = time.monotonic()
    done = self.evaluation.wait_finished(EVAL_FINISH_S, stop=self._stop.is_set)
    logging.info('Reproducible evaluator: %d passes%s (waited %.1fs)',
                 len(self.evaluation.records), '' if done else ', not finished',
                 time.monotonic() - started)

  def _on_round(self, round_index: int) -> StopReason | None:
    """The round gate's hook, at the start of round `round_index` (acting waits, the
    learner has taken every earlier round): its record; a budget or target met; every
    `checkpoint_rounds` rounds and at the round the run ends, a round checkpoint."""
    stop = self.monitor.round_record(round_index, *self._learner_state())
    if round_index == self.resumed_round and self._resumed_envs:
      # Every env's request is in: each must have come from its restored env.
      fresh = sorted(set(range(self.rounds.num_envs)) - self._envs_handed)
      if fresh:
        self.rounds.not_exact(f'resumed at round {round_index}: envs {fresh[:16]} did '
                              'not come back to it (their actors started them anew, or '
                              'went on from where they were: a central node restarted '
                              'alone)', round_index)
    if self._round_checkpoints is not None and round_index > 0 and \
        round_index != self.resumed_round and \
        (round_index % self._config.checkpoint_rounds == 0 or stop is not None):
      self._save_round(round_index)
    return stop

  def _learner_may_step(self, steps: int, timeout_s: float) -> bool:
    """The learner loop's `may_step`: the round gate's (its wait ended by the run's end
    is a no: the loop then sees its stop)."""
    try:
      return self.rounds.learner_may_step(steps, timeout_s)
    except ClockClosedError:
      time.sleep(timeout_s)  # the loop checks its stop; no spinning meanwhile
      return False

  def _rounds_closed(self) -> bool:
    """Whether a round's wait for the learner should end: the run is stopping, or the
    learner will take no more steps (it failed)."""
    loop = self.loop
    return self._closing or self.stop_reason is not None or (
        loop is not None and loop.done.is_set() and loop.error is not None)

  def _final_fields(self) -> Dict[str, Any]:
    """What the summary adds at the end: the policy's weights hash; a reproducible
    run's rounds and how far it is exact."""
    out: Dict[str, Any] = {'weights_sha256': weights_sha256(self._policy_variables)}
    if self.rounds is not None:
      out.update(reproducible=True, last_round=self.rounds.round,
                 exact_until_round=self.rounds.exact_until_round,
                 not_exact_because=self.rounds.not_exact_because,
                 round_learner_wait_s=self.rounds.learner_wait_s,
                 reproducible_machine=machine_pins.describe(
                     self._config.reproducible_threads))
    if self.evaluation is not None:
      out.update(self.evaluation.summary())
    return out

  @staticmethod
  def _learner_failure(error: BaseException | None) -> StopReason:
    if isinstance(error, DivergedError):
      return StopReason(StopKind.DIVERGED, detail=str(error))
    detail = f'{type(error).__name__}: {error}' if error is not None else None
    return StopReason(StopKind.LEARNER_FAILED, detail=detail)

  def finish(self, reason: StopReason) -> Dict[str, Any]:
    """The one end of a run, whichever stop `reason` is; the summary it wrote.

    1. The learner stops (its thread ends after the step in flight) and releases its
       dataset.
    2. `summary.json` is written, once, over the run's steady window.
    3. The last checkpoint is saved, also when the learner's step in flight has not
       ended after `LEARNER_JOIN_S` (not after a failed or diverged learner: the last
       good one stays), and after a planned end (a target or a budget) the policy is
       exported.
    4. The program stops: after a planned end or a divergence (NaN in the loss, actions
       no env may take) with a program stopper, the launcher is
       asked to stop every node, and this node keeps serving until its own stop signal
       arrives; then serving and learning shut down.
    A second call returns the first call's summary.
    """
    with self._finish_lock:
      if self.summary is not None:
        return self.summary
      if self._stop is None:
        self._stop = default_stop_event()
      self.stop_reason = reason
      loop = self.loop
      stopped = loop is None or loop.join(LEARNER_JOIN_S)
      if not stopped:
        logging.warning('Learner thread still in a step after %.0fs; finishing without '
                        'it (the last checkpoint may hold part of that step)',
                        LEARNER_JOIN_S)
      else:
        # Learning is over: release the dataset while the replay node surely serves
        # (dropping a tf.data iterator whose sample is in flight to a server that is
        # stopping blocked this process for seconds, until its supervisor killed it).
        self.learner.close()
      self.summary = self.monitor.summarize(*self._learner_state(), reason,
                                            self.resumed_from, self._final_fields())
      logging.info('Central node finishing (%s): %s', self.summary['stopped_because'],
                   format_line(self.summary))
      # A reproducible run saved its last round checkpoint at a round's start; a save
      # mid-round would be a checkpoint no resume continues exactly from.
      if self._checkpointer is not None and self._round_checkpoints is None and \
          reason.kind not in (StopKind.LEARNER_FAILED, StopKind.DIVERGED):
        self._checkpointer.save(self._counters())
      if self._config.export_policy and reason.is_budget:
        path = os.path.join(self._config.logdir, 'saved_model')
        export_policy(self._builder.policy_network(self._networks), self._spec, path)
        logging.info('Exported the policy to %s', path)
      if reason.ends_program and self._stop_program is not None:
        logging.info('Run ended (%s): stopping the program', reason.sentence())
        self._stop_program()
        self._stop.wait(PROGRAM_STOP_WAIT_S)
      self._stop.set()
      self.shutdown()
      return self.summary

  def shutdown(self) -> None:
    """Stops serving and learning, without waiting out timeouts: new requests are
    refused, the trajectory sink closes (a batch blocked on a full table ends at once),
    then the batcher stops and the learner releases its dataset."""
    self._closing = True
    if self.server is not None:
      self.server.shutdown()
    if self.shm is not None:
      self.shm.close()
    self.learner.close()
