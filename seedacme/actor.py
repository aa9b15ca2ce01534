"""The env-only actor: K environments, one Courier call per step, no model.

An actor process imports numpy, dm_env, Courier and its environments -- never
TensorFlow or a network. Each step it sends the K current timesteps of its envs to the
inference server in ONE call and applies the K actions it gets back.

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
from seedacme.envs.batched import BatchedEnv
from seedacme.envs.registry import EnvFactory
from seedacme.lifecycle import default_stop_event

SERVER_ERROR_MARKER = 'Python exception was raised on the server'




def new_run_id() -> int:
  """A random non-negative 63-bit id."""
  return int.from_bytes(os.urandom(8), 'little') >> 1


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
      env_factory: `factory(seed) -> dm_env.Environment`.
      actor_id: index of this actor (for logs).
      num_envs: K, envs stepped per call.
      first_env_id: global id of this actor's first env; its envs are
        first_env_id .. first_env_id + K - 1.
      counter: optional Courier client of an Acme `Counter`.
      greedy: act greedily and keep out of training data (evaluator).
      seed: env seeds are seed + i.
      max_steps: stop after this many batched steps (None: until stopped).
      eval_interval_s, eval_episodes: evaluation schedule (greedy actors only): every
        `eval_interval_s`, play until `eval_episodes` more episodes have finished,
        then idle. 0: evaluate continuously.
      counter_interval_s, log_interval_s: reporting periods.
      stop_event: set to stop; default is Launchpad's stop event.
    """
    self._inference = inference
    self._envs = BatchedEnv(env_factory, num_envs, seed=seed)
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
    self.steps = 0
    self.episode_returns = collections.deque(maxlen=1000)  # recent, for tests/logs

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
          message = str(e)
          if SERVER_ERROR_MARKER in message and 'InvalidRequestError' in message:
            raise  # Our own request is wrong: retrying cannot help.
          logging.warning('Actor %d: inference call failed (%s); retrying in %.1fs',
                          self._actor_id, message.strip().splitlines()[-1][:200],
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
    logging.info('%s %d: %d envs (ids %d..%d), run id %d', kind, self._actor_id,
                 len(self.env_ids), self.env_ids[0], self.env_ids[-1], self.run_id)
    run_ids = np.full(len(self.env_ids), self.run_id, np.int64)
    ts = self._envs.reset()
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
      request = protocol.make_request(self.env_ids, run_ids, ts.observation, ts.reward,
                                      ts.discount, ts.step_type, greedy=self._greedy)
      reply = self._call(request)
      if reply is None:
        break
      if 'shutting_down' in reply:
        # The server is stopping (end of run, or a restart): wait and send it again.
        logging.info('Actor %d: %s; waiting', self._actor_id, reply['shutting_down'])
        if self._stop.wait(1.0):
          break
        continue
      ts, finished = self._envs.step(reply['action'])
      self.steps += 1
      steps_unreported += len(self.env_ids)
      episodes_unreported += len(finished.returns)
      recent.extend(finished.returns)
      round_episodes += len(finished.returns)
      recent_lengths.extend(finished.lengths)
      self.episode_returns.extend(finished.returns)
      now = time.monotonic()
      if self._counter is not None and now - last_count >= self._counter_interval_s:
        key = 'evaluator' if self._greedy else 'actor'
        self._counter.futures.increment(**{f'{key}_steps': steps_unreported,
                                           f'{key}_episodes': episodes_unreported})
        steps_unreported = episodes_unreported = 0
        last_count = now
      if now - last_log >= self._log_interval_s:
        logging.info('%s %d: %d steps x %d envs, %d episodes in the last %.0fs, '
                     'average return %.3f, average length %.1f', kind, self._actor_id,
                     self.steps, len(self.env_ids), len(recent), now - last_log,
                     float(np.mean(recent)) if recent else float('nan'),
                     float(np.mean(recent_lengths)) if recent_lengths else float('nan'))
        recent, recent_lengths = [], []
        last_log = now
    self._envs.close()
    logging.info('%s %d stopped after %d steps; peak RSS %.0f MB; tensorflow imported: %s',
                 kind, self._actor_id, self.steps,
                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 'tensorflow' in sys.modules)


def run_actor(stop_event: threading.Event, **kwargs) -> None:
  """Entry point of a (supervised) actor process: `EnvActor(**kwargs).run()`."""
  EnvActor(stop_event=stop_event, **kwargs).run()
