"""EnvActor against an in-process inference server: batching, evaluation schedule, errors."""

import threading
import time
from concurrent import futures

import numpy as np
import pytest

from seedacme.types import Mode
from seedacme import envs
from seedacme.actor.env_actor import EnvActor
from seedacme.run.accounting import ActingLog
from seedacme.serving.server import InferenceServer
from seedacme.serving.policy import PolicyStep, StatelessPolicy


class _FirstActionPolicy(StatelessPolicy):

  def act(self, observation, eval_mask, env_ids):
    return PolicyStep(np.zeros(len(observation), np.int32), {}, ())


class _Client:
  """`client.futures.step(request)` like a Courier client, but in-process."""

  def __init__(self, server):
    self.futures = self
    self._server = server
    self.calls = 0

  def step(self, request):
    self.calls += 1
    future = futures.Future()
    try:
      future.set_result(self._server.step(request))
    except Exception as e:  # noqa: BLE001
      future.set_exception(e)
    return future


def _server(num_envs):
  spec = envs.env_spec_of(envs.make_factory('catch')(0))
  return InferenceServer(_FirstActionPolicy(num_envs), spec, num_envs, None,
                         max_batch_envs=num_envs, batch_timeout_s=0.0, acting=ActingLog())


def test_one_call_per_step_for_all_envs():
  server = _server(8)
  client = _Client(server)
  actor = EnvActor(client, envs.make_factory('catch'), actor_id=1, num_envs=4,
                   first_env_id=4, max_steps=30, stop_event=threading.Event())
  try:
    actor.run()
  finally:
    server.close()
  assert client.calls == 30 and actor.steps == 30
  assert server.acting.env_steps(Mode.TRAIN) == 30 * 4
  # Catch lasts 9 steps, then one step restarts it: 3 episodes per env in 30 steps.
  assert server.acting.summary(Mode.TRAIN)['episodes'] == 3 * 4
  # The actor's own account (its log lines, evaluation rounds) agrees with the server's.
  assert actor.env_steps == 30 * 4 and actor.episodes == 3 * 4
  assert actor.acting.env_steps(Mode.EVAL) == 0
  np.testing.assert_array_equal(actor.env_ids, [4, 5, 6, 7])


def test_evaluator_plays_rounds_on_a_schedule():
  server = _server(2)
  client = _Client(server)
  stop = threading.Event()
  evaluator = EnvActor(client, envs.make_factory('catch'), actor_id=0, num_envs=2,
                       first_env_id=0, mode=Mode.EVAL, eval_interval_s=1.0, eval_episodes=4,
                       stop_event=stop)
  timer = threading.Timer(2.5, stop.set)
  timer.start()
  start = time.monotonic()
  try:
    evaluator.run()
  finally:
    timer.cancel()
    server.close()
  assert time.monotonic() - start < 5
  eval_episodes = server.acting.summary(Mode.EVAL)['episodes']
  # Rounds start at 0 s, 1 s, 2 s; each stops after 4 episodes (2 envs x 2 episodes).
  assert 8 <= eval_episodes <= 12, eval_episodes
  assert server.acting.env_steps(Mode.TRAIN) == 0 and server.acting.env_steps(Mode.EVAL) > 0  # evaluation only


def test_invalid_request_is_not_retried():
  server = InferenceServer(_FirstActionPolicy(4), envs.EnvSpec((3,), 'float32', 3), 4, None,
                           max_batch_envs=4, batch_timeout_s=0.0)

  class _CourierLike(_Client):
    def step(self, request):  # what a Courier client raises for a server-side exception
      future = super().step(request)
      if future.exception() is not None:
        failed = futures.Future()
        failed.set_exception(RuntimeError('Python exception was raised on the server:\n'
                                          f'InvalidRequestError: {future.exception()}'))
        return failed
      return future

  client = _CourierLike(server)
  actor = EnvActor(client, envs.make_factory('catch'), 0, 2, 0, max_steps=5,
                   stop_event=threading.Event())
  try:
    with pytest.raises(RuntimeError, match='observation has shape'):
      actor.run()
  finally:
    server.close()
  assert client.calls == 1
