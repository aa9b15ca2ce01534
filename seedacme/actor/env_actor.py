"""The env-only actor: K environments, one inference request per step, no model.

An actor process imports numpy, dm_env, Courier and its environments -- never
TensorFlow or a network. Each step it sends the K current timesteps of its envs to the
inference server in ONE request and applies the K actions it gets back. The request
goes through shared memory when the central node is on the same host, else Courier
(`seedacme.actor.transport`); the loop is the same either way.

The env factory chooses the engine (`seedacme.actor.engines.make_engine`). A
`BatchedEnv`-like engine steps all K envs per call. A half-batch engine (Atari's 'vector_async',
envs/atari_vector.py) hands out K/2 envs at a time: the actor sends that half's request
and, while the server answers, the engine's C++ threads step the other half; each
request carries the env ids of its own half. Both are driven by the same
`recv` -> call -> `send` loop (`Lockstep` adapts the first kind).

Each actor draws a fresh random run id when it starts. The server compares run ids per
env: after a crash and restart the new id tells it to reset those envs' recurrent state
and drop their partial unrolls.

The actor counts its envs' steps and episodes in one `ActingLog` (its log lines and
evaluation rounds read it; with actor-side inference the reports to the central node
are deltas of it, `ActingLog.take_report`).

Start-up marks (`seedacme.runtime.startup`) under the node's name (`actor/<i>`,
`evaluator/<i>`): `envs_built` once the K envs exist, `first_answer` at the first
actions from the inference server.

Round checkpoints. In a reproducible run with them (`round_snapshots`), the actor hands
its envs, pickled, to the central node before each checkpoint round's first request,
and on start asks for them back: an exact resume continues its envs where the round
checkpoint left them (`seedacme.run.resume`). The evaluator does the same at its own
calls of those numbers (its calls are counted as a training env's).

Env faults. An env that raises, or whose step (reset included) has not returned after
`env_step_timeout_s` (a watchdog thread), is reported to the central node by name
(`seedacme.wire.reports.env_fault`: env, env ids, error, seed; it logs and counts it)
and ends the actor: a supervised actor exits with `ENV_FAULT_EXIT_CODE` or
`ENV_HUNG_EXIT_CODE` and its supervisor restarts it. The restarted actor seeds its envs
from the base seed and its restart count (`env_seed`), so it does not replay the same
failure and a run stays reproducible. The limit's default, 60 s, is far above any
step or reset seen here (a DeepMind Lab or Football reset takes seconds; a loaded
2-core machine stretches them): a hang is a hang, not a slow level.
"""

import atexit
import faulthandler
import os
import resource
import sys
import threading
import time
from typing import Any, Callable, Tuple

from absl import logging
import numpy as np

from seedacme.actor.engines import EnvError, env_name, half_batch_driver, make_engine
from seedacme.actor.transport import InferencePath
from seedacme.run.resume import ActorSnapshots
from seedacme.runtime import startup
from seedacme.run.accounting import ActingLog, EpisodeTracker
from seedacme.runtime import supervisor
from seedacme.runtime.lifecycle import default_stop_event
from seedacme.runtime.priority import lower_process_priority
from seedacme.types import EnvFactory, Mode
from seedacme.wire import courier_guard
from seedacme.wire.reports import env_fault, fault_report

# How long one env call (a batch's step or reset) may take before the actor reports
# the env as hung and exits (module docstring).
ENV_STEP_TIMEOUT_S = 60.0
_FAULT_REPORT_TIMEOUT_S = 5.0
# How long an actor asks the central node to take or give its envs' snapshot.
_SNAPSHOT_CALL_S = 120.0


def new_run_id() -> int:
  """A random non-negative 63-bit id."""
  return int.from_bytes(os.urandom(8), 'little') >> 1


def env_seed(seed: int, restarts: int) -> int:
  """The first env seed of an actor restarted `restarts` times: `seed` at first, then
  a number drawn from (seed, restarts), below 2**31 - 2**16 (room for K envs' seeds)."""
  if not restarts:
    return seed
  state = np.random.SeedSequence([seed, restarts]).generate_state(1, np.uint64)[0]
  return int(state % np.uint64(2**31 - 2**16))


def _central_of(inference: Any) -> Any:
  """The central node's client behind `inference`: an actor-side inference's, else
  `inference` itself (not `getattr`: a Courier client answers any name with a method)."""
  try:
    own = vars(inference).get('_central')
  except TypeError:
    own = None
  return own if own is not None else inference


class EnvFaultError(RuntimeError):
  """An env of this actor raised or hung (reported; the actor ends)."""

  def __init__(self, fault: dict):
    super().__init__(f"env {fault['env_name']} (ids {fault['env_ids']}, seed "
                     f"{fault['seed']}) {fault['kind']}: {fault['error_type']}: "
                     f"{fault['message']}")
    self.fault = fault


class EnvActor:
  """Steps `num_envs` environments for the inference server."""

  def __init__(self, inference: Any, env_factory: EnvFactory, actor_id: int,
               num_envs: int, first_env_id: int, mode: Mode = Mode.TRAIN,
               seed: int = 0, max_steps: int | None = None, log_interval_s: float = 30.0,
               eval_interval_s: float = 0.0, eval_episodes: int = 20,
               acting: ActingLog | None = None, transport: str = 'auto',
               stop_event: threading.Event | None = None, nice: int = 0,
               env_step_timeout_s: float | None = ENV_STEP_TIMEOUT_S,
               on_env_hang: Callable[[], None] | None = None, central: Any = None,
               round_snapshots: Tuple[int, int] | None = None):
    """Creates the actor.

    Args:
      inference: a Courier client of the central node (has `futures.step(request)`),
        or an actor's own inference (`seedacme.actor.actor_side`).
      env_factory: `factory(seed) -> dm_env.Environment`; a `make_engine(num_envs,
        seed)` method, if it has one, builds the K envs (`actor.engines.make_engine`).
      actor_id: index of this actor (for logs).
      num_envs: K, envs stepped per call.
      first_env_id: global id of this actor's first env; its envs are
        first_env_id .. first_env_id + K - 1.
      mode: `Mode.TRAIN`, or `Mode.EVAL` for the evaluator (greedy actions, no
        training data); sent with every request.
      seed: env seeds are seed + i (a restarted actor: `env_seed(seed, restarts)` + i).
      max_steps: stop after this many inference calls (None: until stopped); a call
        covers all K envs, or K/2 with a half-batch engine.
      log_interval_s: period of the actor's log line.
      eval_interval_s, eval_episodes: evaluation schedule (`Mode.EVAL` only): every
        `eval_interval_s`, play until `eval_episodes` more episodes have finished,
        then idle. 0: evaluate continuously.
      acting: the actor's acting account (default: a new `ActingLog`).
      transport: 'auto' (shared memory when the central node offers it on this host,
        else Courier), 'courier' or 'shm' (`seedacme.actor.transport`).
      stop_event: set to stop; default is Launchpad's stop event.
      nice: lower this process's CPU priority by this much when `run` starts
        (`ProgramConfig.acting_nice`; 0: unchanged).
      env_step_timeout_s: an env call that takes longer is a hung env (None: no
        watchdog).
      on_env_hang: what ends the actor after a hung env was reported (default: this
        process exits with `ENV_HUNG_EXIT_CODE`; the hung call cannot be interrupted).
      central: where env faults are reported (`report_acting`); default: `inference`'s
        central node (the inference client itself, or an actor-side inference's).
      round_snapshots: (unroll length, checkpoint_rounds) of a reproducible run with
        round checkpoints: the envs are handed to the central node at each checkpoint
        round's first call and restored from it on an exact resume
        (`seedacme.run.resume`); None: neither.
    """
    self._inference = inference
    self._central = central if central is not None else _central_of(inference)
    self.restarts = supervisor.restart_count()
    self.seed = env_seed(seed, self.restarts)
    self._factory = env_factory
    self._engine = make_engine(env_factory, num_envs, seed=self.seed)
    self._envs = half_batch_driver(self._engine)
    startup.mark(self._node_name(mode, actor_id), 'envs_built')
    self._env_step_timeout_s = env_step_timeout_s
    self._on_env_hang = on_env_hang or _exit_hung
    self._watching = False
    self._env_call_started: float | None = None  # while an env call runs
    self._env_call_slots: np.ndarray | None = None  # the engine slots it steps
    self._fault_lock = threading.Lock()
    self.fault: dict | None = None  # the env fault that ended this actor, if any
    self._actor_id = actor_id
    self.mode = mode
    self._max_steps = max_steps
    self._eval_interval_s = eval_interval_s if mode is Mode.EVAL else 0.0
    self._eval_episodes = eval_episodes
    self._log_interval_s = log_interval_s
    self._stop = stop_event
    self.env_ids = np.arange(first_env_id, first_env_id + num_envs, dtype=np.int64)
    self.run_id = new_run_id()
    self.steps = 0  # inference calls answered with actions
    self.acting = acting if acting is not None else ActingLog()
    self._episodes = EpisodeTracker(num_envs)  # by slot (the engine's env index)
    self._transport = transport
    self.path: InferencePath | None = None  # made by `run`, with its stop event
    self._nice = nice
    self._snapshots = None if round_snapshots is None else ActorSnapshots(
        self.env_ids, *round_snapshots, send=self._send_snapshot, fetch=self._fetch_snapshot)
    if self.restarts:
      logging.info('Actor %d restarted (%d before): env seeds from %d (base seed %d)',
                   actor_id, self.restarts, self.seed, seed)

  @staticmethod
  def _node_name(mode: Mode, actor_id: int) -> str:
    """The program's name of this actor's node (`actor/0`, `evaluator/0`)."""
    return f'{"evaluator" if mode is Mode.EVAL else "actor"}/{actor_id}'

  @property
  def env_steps(self) -> int:
    """Env steps taken (all in this actor's mode)."""
    return self.acting.env_steps(self.mode)

  @property
  def episodes(self) -> int:
    """Episodes finished."""
    return self.acting.episodes(self.mode)

  def _log_progress(self, kind: str, since_s: float) -> None:
    summary = self.acting.summary(self.mode)
    logging.info('%s %d: %d env steps (%d calls), %d episodes, average return %.3f and '
                 'length %.1f over the last %d (log every %.0fs)', kind, self._actor_id,
                 self.env_steps, self.steps, summary['episodes'],
                 summary['average_return'], summary['average_length'],
                 summary['average_over'], since_s)

  def run(self) -> None:
    """Steps the envs until the stop event is set (or `max_steps`)."""
    if self._stop is None:
      self._stop = default_stop_event()
    lower_process_priority(self._nice)
    kind = 'evaluator' if self.mode is Mode.EVAL else 'actor'
    logging.info('%s %d: %d envs (ids %d..%d) in batches of %d, run id %d', kind,
                 self._actor_id, len(self.env_ids), self.env_ids[0], self.env_ids[-1],
                 self._envs.batch_size, self.run_id)
    run_ids = np.full(len(self.env_ids), self.run_id, np.int64)
    self.path = path = InferencePath(self._inference, int(self.env_ids[0]),
                                     len(self.env_ids), self._stop, self._transport,
                                     f'{kind} {self._actor_id}')
    started = time.monotonic()
    self._watching = bool(self._env_step_timeout_s)
    if self._watching:
      threading.Thread(target=self._watch_env_calls, args=(kind,), daemon=True,
                       name='env-watchdog').start()
    try:
      all_slots = np.arange(len(self.env_ids))
      batch = self._env_call(kind, all_slots, self._envs.recv)
      if self._snapshots is not None:  # an exact resume: the envs of its round
        calls, _ = self._snapshots.resume(self._envs)
        if calls:
          self.steps = calls
          batch = self._env_call(kind, all_slots, self._envs.recv)
      last_log = time.monotonic()
      round_start, round_first_episode = time.monotonic(), 0
      while not self._stop.is_set():
        if self._eval_interval_s and self.episodes - round_first_episode >= self._eval_episodes:
          # Evaluation round done: idle until the next one is due.
          if self._stop.wait(max(0.0, round_start + self._eval_interval_s - time.monotonic())):
            break
          round_start, round_first_episode = time.monotonic(), self.episodes
        if self._max_steps is not None and self.steps >= self._max_steps:
          break
        if self._snapshots is not None:
          self._snapshots.maybe_save(self.steps, self._envs)
        ts = batch.step
        reply = path.step(self.env_ids[batch.slots], run_ids[:len(batch.slots)],
                          ts.observation, ts.reward, ts.discount, ts.step_type, self.mode)
        if reply is None:
          break
        if 'shutting_down' in reply:
          # The server is stopping (end of run, or a restart): wait and send it again.
          logging.info('Actor %d: %s; waiting', self._actor_id, reply['shutting_down'])
          if self._stop.wait(1.0):
            break
          continue
        if self.steps == 0:
          # Start-up diagnostics (and what tests wait for before killing an actor).
          logging.info('%s %d: first answer from the inference server after %.1fs (%s)',
                       kind, self._actor_id, time.monotonic() - started, path.name)
          startup.mark(self._node_name(self.mode, self._actor_id), 'first_answer')
        self._env_call(kind, batch.slots, self._envs.send, reply['action'])
        # A half-batch engine: the other half, stepped meanwhile.
        batch = self._env_call(kind, all_slots, self._envs.recv)
        self.steps += 1
        self.acting.add_steps(self.mode, len(batch.slots))
        self.acting.add_episodes(self.mode, self._episodes.observe(
            batch.slots, batch.step.step_type, batch.step.reward))
        now = time.monotonic()
        if now - last_log >= self._log_interval_s:
          self._log_progress(kind, now - last_log)
          last_log = now
    finally:
      self._watching = False  # ends the watchdog
    path.close()
    self._envs.close()
    logging.info('%s %d stopped after %d calls; peak RSS %.0f MB; tensorflow imported: %s',
                 kind, self._actor_id, self.steps,
                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 'tensorflow' in sys.modules)

  # ---- round checkpoints (`seedacme.run.resume`) -------------------------------------
  def _ask_central(self, method: str, *args) -> Any:
    """`method(*args)` on the central node, asked again while it does not answer (it
    may be starting); None once stopped or after `_SNAPSHOT_CALL_S`."""
    deadline = time.monotonic() + _SNAPSHOT_CALL_S
    while not self._stop.is_set() and time.monotonic() < deadline:
      try:
        call = getattr(self._central.futures, method)
        return courier_guard.accept(
            call(*courier_guard.plain(args)).result(timeout=_FAULT_REPORT_TIMEOUT_S),
            method)
      except Exception as e:  # pylint: disable=broad-except
        logging.info('Actor %d: %s not answered (%s); asking again', self._actor_id,
                     method, str(e).strip()[-200:])
        self._stop.wait(1.0)
    return None

  def _send_snapshot(self, round_index, env_ids, blobs, why) -> None:
    self._ask_central('env_snapshot', round_index, env_ids, blobs, why)

  def _fetch_snapshot(self, env_ids):
    return self._ask_central('resume_envs', env_ids)

  # ---- env faults ----------------------------------------------------------------------
  def _env_call(self, kind: str, slots: np.ndarray, method, *args):
    """`method(*args)` of the engine, timed by the watchdog; an env that raises is
    reported and ends the actor (`EnvFaultError`)."""
    self._env_call_slots = slots
    self._env_call_started = time.monotonic()
    try:
      return method(*args)
    except Exception as e:  # pylint: disable=broad-except
      # `EnvError` names the env; an engine of its own (e.g. Atari's vector engines)
      # does not: the fault names the envs of the call.
      error = e.error if isinstance(e, EnvError) else e
      if isinstance(e, EnvError):
        slots = np.asarray([e.slot])
      fault = self._fault('raised', kind, slots, type(error).__name__, str(error))
      if fault is None:  # the watchdog reported this call already
        raise
      raise EnvFaultError(fault) from e
    finally:
      self._env_call_started = None

  def _fault(self, what: str, kind: str, slots: np.ndarray, error_type: str,
             message: str) -> dict | None:
    """Logs and reports one env fault (the first only; None after it)."""
    with self._fault_lock:
      if self.fault is not None:
        return None
      slots = np.asarray(slots, np.int64)
      names = getattr(self._engine, 'names', None)
      name = names[int(slots[0])] if names is not None and len(slots) == 1 else \
          env_name(self._factory)
      self.fault = fault = env_fault(what, f'{kind} {self._actor_id}', name,
                                     self.env_ids[slots].tolist(), error_type, message,
                                     self.seed + int(slots[0]) if len(slots) == 1
                                     else self.seed)
    logging.error('%s %d: env %s (env ids %s, seed %d) %s: %s: %s', kind, self._actor_id,
                  name, fault['env_ids'], fault['seed'], what, error_type, message)
    try:  # to the central node's log and summary; bounded: it may be away
      self._central.futures.report_acting(
          courier_guard.plain(fault_report(self._actor_id, [fault]))).result(
          timeout=_FAULT_REPORT_TIMEOUT_S)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('%s %d: could not report the env fault to the central node: %s',
                      kind, self._actor_id, str(e).strip()[-300:])
    return fault

  def _watch_env_calls(self, kind: str) -> None:
    """Reports an env call that has run over `env_step_timeout_s`, then ends the actor."""
    limit = self._env_step_timeout_s
    while self._watching and not self._stop.is_set():
      started, slots = self._env_call_started, self._env_call_slots
      if started is not None and time.monotonic() - started > limit:
        current = getattr(self._engine, 'current_slot', None)
        if current is not None:
          slots = np.asarray([current])
        if self._fault('hung', kind, slots, 'EnvStepTimeout',
                       f'an env call has not returned after {limit:.0f}s '
                       '(env_step_timeout_s)') is not None:
          self._on_env_hang()
        return
      self._stop.wait(min(1.0, limit / 4))


def _exit_hung() -> None:
  """Ends this process after a hung env: its stacks to the log (where it hung), exit
  hooks, then `ENV_HUNG_EXIT_CODE`."""
  faulthandler.dump_traceback(all_threads=True)
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(supervisor.ENV_HUNG_EXIT_CODE)  # pylint: disable=protected-access


def run_actor(stop_event: threading.Event, **kwargs) -> None:
  """Entry point of a (supervised) actor process: `EnvActor(**kwargs).run()`; an env
  fault (reported already) ends it with `ENV_FAULT_EXIT_CODE`, for a restart."""
  try:
    EnvActor(stop_event=stop_event, **kwargs).run()
  except EnvFaultError as e:
    exit_for_env_fault(e)


def exit_for_env_fault(error: 'EnvFaultError') -> None:
  """Ends an actor process whose env faulted (reported already) with the supervisor's
  env-fault exit code, so it restarts on new seeds."""
  logging.error('Actor exits for a restart on new seeds: %s', error)
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(supervisor.ENV_FAULT_EXIT_CODE)  # pylint: disable=protected-access
