"""EnvActor with ale-py's vector engines, against a fake in-process inference server.

The fake answers each env with the next action of that env's own plan (after a delay,
from another thread, like a Courier future), and records every request. Without no-ops
or sticky actions each env's timeline depends only on its own actions, so it can be
replayed on the per-env Python loop and compared step by step.
"""

import threading
import time
from concurrent import futures

import dm_env
import numpy as np

from seedacme import envs

from seedacme.wire import protocol
from seedacme.actor.env_actor import EnvActor
from seedacme.actor.engines import BatchedEnv

FIRST, MID, LAST = (int(dm_env.StepType.FIRST), int(dm_env.StepType.MID),
                    int(dm_env.StepType.LAST))


class _PlannedServer:
  """`client.futures.step(request)`: env first_env_id + e's n-th request gets `plans[e][n]`."""

  def __init__(self, plans: np.ndarray, first_env_id: int, delay_s: float = 0.0,
               shutting_down_once: bool = False):
    self.futures = self
    self._plans = plans
    self._first_env_id = first_env_id
    self._delay_s = delay_s
    self._pool = futures.ThreadPoolExecutor(1)
    self._count = np.zeros(len(plans), np.int64)
    self._lock = threading.Lock()
    self._shutting_down_once = shutting_down_once
    self.requests = []  # every request, in order
    self.in_flight = 0
    self.max_in_flight = 0

  def step(self, request):
    request = protocol.fields(request)  # by logical field: env_ids, reward, ...
    with self._lock:
      self.requests.append(request)
      self.in_flight += 1
      self.max_in_flight = max(self.max_in_flight, self.in_flight)
    return self._pool.submit(self._answer, request)

  def _answer(self, request):
    time.sleep(self._delay_s)
    with self._lock:
      self.in_flight -= 1
      if self._shutting_down_once:
        self._shutting_down_once = False
        return {'shutting_down': 'restarting'}
      ids = request['env_ids'] - self._first_env_id
      actions = self._plans[ids, self._count[ids]].astype(np.int32)
      self._count[ids] += 1
      return {'action': actions}

  def close(self):
    self._pool.shutdown()


def _timelines(requests, first_env_id, num_envs):
  """Per env: the (observation, reward, discount, step_type) it sent, in order."""
  seen = [[] for _ in range(num_envs)]
  for request in requests:
    for j, env_id in enumerate(request['env_ids']):
      seen[env_id - first_env_id].append(
          (request['observation'][j], request['reward'][j], request['discount'][j],
           request['step_type'][j]))
  return seen


def _replay(plans, steps, seed):
  """What the per-env Python loop gives for the same per-env actions."""
  python = BatchedEnv(envs.make_factory('atari', noop_max=0), len(plans), seed=seed)
  try:
    out = [python.reset()]
    for t in range(steps - 1):
      out.append(python.step(plans[:, t]))
    return out
  finally:
    python.close()


def _run(engine, num_envs, max_steps, delay_s, first_env_id=8, plans=None, **kwargs):
  plans = np.random.RandomState(0).randint(6, size=(num_envs, 400)) if plans is None \
      else plans
  server = _PlannedServer(plans, first_env_id, delay_s, **kwargs)
  factory = envs.make_factory('atari', engine=engine, noop_max=0, num_threads=1)
  actor = EnvActor(server, factory, actor_id=1, num_envs=num_envs,
                   first_env_id=first_env_id, seed=5, max_steps=max_steps,
                   stop_event=threading.Event())
  try:
    actor.run()
  finally:
    server.close()
  return actor, server, plans


def test_async_actor_sends_disjoint_halves_and_consistent_timelines():
  k = 4
  actor, server, plans = _run('vector_async', k, max_steps=120, delay_s=0.02)
  requests = server.requests
  assert len(requests) == 120 == actor.steps and actor.env_steps == 120 * k // 2
  ids = [set(r['env_ids'].tolist()) for r in requests]
  for request, members in zip(requests, ids):
    assert len(members) == k // 2 == len(request['env_ids'])  # no duplicates
    assert members <= set(range(8, 8 + k))
    assert (request['run_ids'] == actor.run_id).all()
    assert request['observation'].shape == (k // 2, 84, 84, 4)
  # One request in flight at a time; the other half is with the engine meanwhile.
  # With a 20 ms server the other half is always ready first: requests alternate
  # between two disjoint halves.
  assert server.max_in_flight == 1
  assert all(not (a & b) for a, b in zip(ids, ids[1:]))
  assert ids[0] | ids[1] == set(range(8, 8 + k))

  seen = _timelines(requests, 8, k)
  assert [len(s) for s in seen] == [60] * k  # every env got every second call
  expected = _replay(plans, 60, seed=5)
  for env in range(k):
    types = [s[3] for s in seen[env]]
    assert types[0] == FIRST
    for t, (obs, reward, discount, step_type) in enumerate(seen[env]):
      np.testing.assert_array_equal(obs, expected[t].observation[env], err_msg=f'{env} {t}')
      assert (reward, discount, step_type) == (
          expected[t].reward[env], expected[t].discount[env], expected[t].step_type[env])


def test_async_actor_timeline_across_an_episode_end():
  # Pong with these plans ends an episode before 1000 steps; with K=2 the halves are
  # single envs, so each env's timeline crosses LAST -> FIRST.
  k = 2
  plans = np.random.RandomState(0).randint(6, size=(k, 1200))
  actor, server, _ = _run('vector_async', k, max_steps=2 * 1100, delay_s=0.0, plans=plans)
  assert actor.episodes >= 1
  seen = _timelines(server.requests, 8, k)
  for env in range(k):
    types = [s[3] for s in seen[env]]
    assert types[0] == FIRST and LAST in types
    for prev, cur, step in zip(types, types[1:], seen[env][1:]):
      assert (cur == FIRST) == (prev == LAST)  # exactly: LAST is followed by FIRST
      if cur == FIRST:
        assert step[1] == 0.0 and step[2] == 1.0


def test_sync_vector_actor_matches_the_python_loop():
  k = 3
  actor, server, plans = _run('vector_sync', k, max_steps=40, delay_s=0.0)
  assert actor.steps == 40 and actor.env_steps == 40 * k
  assert all(r['env_ids'].tolist() == [8, 9, 10] for r in server.requests)
  expected = _replay(plans, 40, seed=5)
  for t, request in enumerate(server.requests):
    np.testing.assert_array_equal(request['observation'], expected[t].observation)
    np.testing.assert_array_equal(request['step_type'], expected[t].step_type)


def test_async_actor_resends_the_same_half_while_the_server_shuts_down():
  k = 4
  actor, server, _ = _run('vector_async', k, max_steps=6, delay_s=0.0,
                          shutting_down_once=True)
  first, second = server.requests[:2]
  np.testing.assert_array_equal(first['env_ids'], second['env_ids'])
  np.testing.assert_array_equal(first['observation'], second['observation'])
  assert actor.steps == 6 and len(server.requests) == 7
