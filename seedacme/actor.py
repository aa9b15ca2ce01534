"""The env-only actor: K environments, one Courier call per step, no model.

An actor process imports numpy, dm_env, Courier and its environments -- never
TensorFlow or a network. Each step it sends the K current timesteps of its envs to the
inference server in ONE call and applies the K actions it gets back.

The env factory chooses the engine (`envs.registry.make_engine`). A `BatchedEnv`-like
engine steps all K envs per call. A half-batch engine (Atari's 'vector_async',
envs/atari_vector.py) hands out K/2 envs at a time: the actor sends that half's request
and, while the server answers, the engine's C++ threads step the other half; each
request carries the env ids of its own half. Both are driven by the same
`recv` -> call -> `send` loop (`Lockstep` adapts the first kind).

Each actor draws a fresh random run id when it starts. The server compares run ids per
env: after a crash and restart the new id tells it to reset those envs' recurrent state
and drop their partial unrolls.
"""

import collections
import os
import resource
import sys
import threading
import time
from concurrent import futures
from typing import Any

from absl import logging
import numpy as np

from seedacme import protocol
from seedacme.accounting import EpisodeTracker
from seedacme.envs.atari_vector import SlotStep
from seedacme.envs.registry import EnvFactory, make_engine
from seedacme.lifecycle import default_stop_event





def new_run_id() -> int:
  """A random non-negative 63-bit id."""
  return int.from_bytes(os.urandom(8), 'little') >> 1


class Lockstep:
  """Drives a `BatchedEnv`-like engine (`reset`, `step`) through `recv`/`send`.

  `recv()` returns all K envs (the first call resets them); `send(actions)` steps them.
  """

  def __init__(self, envs: Any):
    self._envs = envs
    self.spec = envs.spec
    self.num_envs = envs.num_envs
    self.batch_size = envs.num_envs
    self._slots = np.arange(envs.num_envs, dtype=np.int64)
    self._pending: SlotStep | None = None

  def recv(self) -> SlotStep:
    """The K current timesteps (reset on the first call)."""
    if self._pending is None:
      return SlotStep(self._slots, self._envs.reset())
    pending, self._pending = self._pending, None
    return pending

  def send(self, actions: np.ndarray) -> None:
    """Steps all K envs; `recv()` returns the result."""
    self._pending = SlotStep(self._slots, self._envs.step(actions))

  def close(self) -> None:
    self._envs.close()


def half_batch_driver(engine: Any) -> Any:
  """`engine` itself if it has `recv`/`send`, else `Lockstep(engine)`."""
  return engine if hasattr(engine, 'recv') else Lockstep(engine)


class EnvActor:
  """Steps `num_envs` environments for the central inference server."""

  SLOW_CALL_WARNING_S = 5.0

  def __init__(self, inference: Any, env_factory: EnvFactory, actor_id: int,
               num_envs: int, first_env_id: int, counter: Any = None,
               greedy: bool = False, seed: int = 0, max_steps: int | None = None,
               counter_interval_s: float = 2.0, log_interval_s: float = 30.0,
               eval_interval_s: float = 0.0, eval_episodes: int = 20,
               stop_event: threading.Event | None = None):
    """Creates the actor.

    Args:
      inference: a Courier client of the central node (has `step(request)`).
      env_factory: `factory(seed) -> dm_env.Environment`; a `make_engine(num_envs,
        seed)` method, if it has one, builds the K envs (envs.registry.make_engine).
      actor_id: index of this actor (for logs).
      num_envs: K, envs stepped per call.
      first_env_id: global id of this actor's first env; its envs are
        first_env_id .. first_env_id + K - 1.
      counter: optional Courier client of an Acme `Counter`.
      greedy: act greedily and keep out of training data (evaluator).
      seed: env seeds are seed + i.
      max_steps: stop after this many inference calls (None: until stopped); a call
        covers all K envs, or K/2 with a half-batch engine.
      eval_interval_s, eval_episodes: evaluation schedule (greedy actors only): every
        `eval_interval_s`, play until `eval_episodes` more episodes have finished,
        then idle. 0: evaluate continuously.
      counter_interval_s, log_interval_s: reporting periods.
      stop_event: set to stop; default is Launchpad's stop event.
    """
    self._inference = inference
    self._envs = half_batch_driver(make_engine(env_factory, num_envs, seed=seed))
    self._actor_id = actor_id
    self._counter = counter
    self._greedy = greedy
    self._max_steps = max_steps
    self._eval_interval_s = eval_interval_s if greedy else 0.0
    self._eval_episodes = eval_episodes
    self._counter_interval_s = counter_interval_s
    self._log_interval_s = log_interval_s
    self._stop = stop_event
    self.env_ids = np.arange(first_env_id, first_env_id + num_envs, dtype=np.int64)
    self.run_id = new_run_id()
    self.steps = 0  # inference calls answered with actions
    self.env_steps = 0
    self.episode_returns = collections.deque(maxlen=1000)  # recent, for tests/logs
    self._episodes = EpisodeTracker(num_envs)  # by slot (the engine's env index)

  def _call(self, request):
    """One inference call, retried with backoff while the server is unreachable.

    The call is asynchronous and waited on in short slices: a process blocked inside a
    synchronous RPC cannot run its SIGTERM handler, and Launchpad would SIGKILL it.
    Returns None once the stop event is set.
    """
    backoff = 0.1
    while not self._stop.is_set():
      future = self._inference.futures.step(request)
      sent = time.monotonic()
      next_warning = sent + self.SLOW_CALL_WARNING_S
      while True:
        try:
          return future.result(timeout=0.2)
        except futures.TimeoutError:
          if self._stop.is_set():
            future.cancel()
            return None
          if time.monotonic() >= next_warning:
            # gRPC waits for a restarting server by itself; say so instead of hanging mute.
            logging.warning('Actor %d: no answer from the inference server for %.0fs; '
                            'waiting for it (restarting, or the learner is behind)',
                            self._actor_id, time.monotonic() - sent)
            next_warning += 30.0
        except Exception as e:  # pylint: disable=broad-except
          refusal = protocol.as_refusal(e)
          if refusal is e:
            raise  # Our own request is wrong: retrying cannot help.
          if refusal is not None:
            raise refusal from e
          logging.warning('Actor %d: inference call failed (%s); retrying in %.1fs',
                          self._actor_id, str(e).strip().splitlines()[-1][:200],
                          backoff)
          self._stop.wait(backoff)
          backoff = min(2 * backoff, 5.0)
          break
    return None

  def run(self) -> None:
    """Steps the envs until the stop event is set (or `max_steps`)."""
    if self._stop is None:
      self._stop = default_stop_event()
    kind = 'evaluator' if self._greedy else 'actor'
    logging.info('%s %d: %d envs (ids %d..%d) in batches of %d, run id %d', kind,
                 self._actor_id, len(self.env_ids), self.env_ids[0], self.env_ids[-1],
                 self._envs.batch_size, self.run_id)
    run_ids = np.full(len(self.env_ids), self.run_id, np.int64)
    started = time.monotonic()
    batch = self._envs.recv()
    last_count = last_log = time.monotonic()
    steps_unreported = episodes_unreported = 0
    recent, recent_lengths = [], []
    round_start, round_episodes = time.monotonic(), 0
    while not self._stop.is_set():
      if self._eval_interval_s and round_episodes >= self._eval_episodes:
        # Evaluation round done: idle until the next one is due.
        if self._stop.wait(max(0.0, round_start + self._eval_interval_s - time.monotonic())):
          break
        round_start, round_episodes = time.monotonic(), 0
      if self._max_steps is not None and self.steps >= self._max_steps:
        break
      ts = batch.step
      request = protocol.make_request(self.env_ids[batch.slots], run_ids[:len(batch.slots)],
                                      ts.observation, ts.reward, ts.discount, ts.step_type,
                                      greedy=self._greedy)
      reply = self._call(request)
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
        logging.info('%s %d: first answer from the inference server after %.1fs', kind,
                     self._actor_id, time.monotonic() - started)
      self._envs.send(reply['action'])
      batch = self._envs.recv()  # a half-batch engine: the other half, stepped meanwhile
      finished = self._episodes.observe(batch.slots, batch.step.step_type, batch.step.reward)
      self.steps += 1
      self.env_steps += len(batch.slots)
      steps_unreported += len(batch.slots)
      episodes_unreported += len(finished.returns)
      recent.extend(finished.returns.tolist())
      round_episodes += len(finished.returns)
      recent_lengths.extend(finished.lengths.tolist())
      self.episode_returns.extend(finished.returns.tolist())
      now = time.monotonic()
      if self._counter is not None and now - last_count >= self._counter_interval_s:
        key = 'evaluator' if self._greedy else 'actor'
        self._counter.futures.increment(**{f'{key}_steps': steps_unreported,
                                           f'{key}_episodes': episodes_unreported})
        steps_unreported = episodes_unreported = 0
        last_count = now
      if now - last_log >= self._log_interval_s:
        logging.info('%s %d: %d env steps (%d calls), %d episodes in the last %.0fs, '
                     'average return %.3f, average length %.1f', kind, self._actor_id,
                     self.env_steps, self.steps, len(recent), now - last_log,
                     float(np.mean(recent)) if recent else float('nan'),
                     float(np.mean(recent_lengths)) if recent_lengths else float('nan'))
        recent, recent_lengths = [], []
        last_log = now
    self._envs.close()
    logging.info('%s %d stopped after %d calls; peak RSS %.0f MB; tensorflow imported: %s',
                 kind, self._actor_id, self.steps,
                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 'tensorflow' in sys.modules)


def run_actor(stop_event: threading.Event, **kwargs) -> None:
  """Entry point of a (supervised) actor process: `EnvActor(**kwargs).run()`."""
  EnvActor(stop_event=stop_event, **kwargs).run()
