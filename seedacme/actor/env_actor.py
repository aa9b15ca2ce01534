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
"""

import os
import resource
import sys
import threading
import time
from typing import Any

from absl import logging
import numpy as np

from seedacme.actor.engines import half_batch_driver, make_engine
from seedacme.actor.transport import InferencePath
from seedacme.run.accounting import ActingLog, EpisodeTracker
from seedacme.runtime.lifecycle import default_stop_event
from seedacme.runtime.priority import lower_process_priority
from seedacme.types import EnvFactory, Mode


def new_run_id() -> int:
  """A random non-negative 63-bit id."""
  return int.from_bytes(os.urandom(8), 'little') >> 1


class EnvActor:
  """Steps `num_envs` environments for the inference server."""

  def __init__(self, inference: Any, env_factory: EnvFactory, actor_id: int,
               num_envs: int, first_env_id: int, mode: Mode = Mode.TRAIN,
               seed: int = 0, max_steps: int | None = None, log_interval_s: float = 30.0,
               eval_interval_s: float = 0.0, eval_episodes: int = 20,
               acting: ActingLog | None = None, transport: str = 'auto',
               stop_event: threading.Event | None = None, nice: int = 0):
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
      seed: env seeds are seed + i.
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
    """
    self._inference = inference
    self._envs = half_batch_driver(make_engine(env_factory, num_envs, seed=seed))
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
    batch = self._envs.recv()
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
      self._envs.send(reply['action'])
      batch = self._envs.recv()  # a half-batch engine: the other half, stepped meanwhile
      self.steps += 1
      self.acting.add_steps(self.mode, len(batch.slots))
      self.acting.add_episodes(self.mode, self._episodes.observe(
          batch.slots, batch.step.step_type, batch.step.reward))
      now = time.monotonic()
      if now - last_log >= self._log_interval_s:
        self._log_progress(kind, now - last_log)
        last_log = now
    path.close()
    self._envs.close()
    logging.info('%s %d stopped after %d calls; peak RSS %.0f MB; tensorflow imported: %s',
                 kind, self._actor_id, self.steps,
                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 'tensorflow' in sys.modules)


def run_actor(stop_event: threading.Event, **kwargs) -> None:
  """Entry point of a (supervised) actor process: `EnvActor(**kwargs).run()`."""
  EnvActor(stop_event=stop_event, **kwargs).run()
