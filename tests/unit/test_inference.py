"""InferenceServer: server-side state per env, run-id resets, unrolls, per-caller errors."""

import contextlib
import threading
import time

import numpy as np
import pytest

from seedacme.types import Mode
from seedacme.types import EnvSpec
from seedacme.run.accounting import ActingLog
from seedacme.serving.server import InferenceServer
from seedacme.serving.policy import PolicyStep, ServerPolicy
from seedacme.wire.protocol import InvalidRequestError, make_request
from seedacme.trajectories.assembler import SequenceAssembler

SPEC = EnvSpec(observation_shape=(2,), observation_dtype='float32', num_actions=5)


class StepCountingPolicy(ServerPolicy):
  """Recurrent state = steps since the state was last reset; action = state mod 5.

  Greedy envs act `4 - action`, so tests can tell which mode served them.
  """

  def __init__(self, num_envs=8):
    self.num_envs = num_envs
    self.batch_sizes = []
    self._count = np.zeros((num_envs, 1), np.int64)

  def step(self, env_ids, observation, reset, eval_mask):
    self.batch_sizes.append(len(observation))
    self._count[env_ids[reset]] = 0
    count = self._count[env_ids, 0].copy()
    self._count[env_ids] += 1
    action = np.where(eval_mask, 4 - count % 5, count % 5).astype(np.int32)
    return PolicyStep(action, {'count': count}, (count[:, None],))

  def state_of(self, env_ids):
    return (self._count[env_ids].copy(),)


def _request(env_ids, run_id, step_type, mode=Mode.TRAIN, reward=0.0, obs=0.0):
  k = len(env_ids)
  return make_request(env_ids, np.full(k, run_id), np.full((k, 2), obs, np.float32),
                      np.full(k, reward), np.ones(k), np.full(k, step_type), mode)


@contextlib.contextmanager
def _serving(num_envs=4, sink=None, policy=None, **kwargs):
  """An InferenceServer (over a `StepCountingPolicy` unless `policy`), closed after."""
  kwargs.setdefault('max_batch_envs', 2)
  kwargs.setdefault('batch_timeout_s', 0.001)
  kwargs.setdefault('acting', ActingLog())  # the central node's account
  server = InferenceServer(policy or StepCountingPolicy(num_envs), SPEC, num_envs, sink,
                           **kwargs)
  try:
    yield server
  finally:
    server.close()


def _assembler(length, period):
  """A SequenceAssembler over 4 envs, and the list its sequences go to."""
  out = []
  return SequenceAssembler(num_envs=4, length=length, period=period,
                           on_sequences=out.append), out


def test_state_is_kept_per_env_and_reset_on_first():
  with _serving() as server:
    actions = [server.step(_request([0, 1], 7, st))['action'].tolist()
               for st in (0, 1, 1)]
    assert actions == [[0, 0], [1, 1], [2, 2]]
    # Env 1 starts a new episode: only its state resets.
    r = make_request([0, 1], [7, 7], np.zeros((2, 2), np.float32), [0, 0], [1, 1], [1, 0])
    assert server.step(r)['action'].tolist() == [3, 0]


def test_changed_run_id_resets_state_and_drops_partial_unroll():
  sink, out = _assembler(length=3, period=2)
  with _serving(sink=sink) as server:
    server.step(_request([0, 1], 7, 0))
    server.step(_request([0, 1], 7, 1))
    # Actor restarts (new run id) mid-episode and, unusually, sends MID: the server
    # must still reset, because the run id changed.
    action = server.step(_request([0, 1], 8, 1))['action']
    assert action.tolist() == [0, 0]
    assert server.actor_restarts == 1
    assert out == []  # the two steps before the restart never became an unroll
    server.step(_request([0, 1], 8, 1))
    server.step(_request([0, 1], 8, 1))
    assert len(out) == 1
    np.testing.assert_array_equal(out[0]['extras']['count'], [[0, 1, 2], [0, 1, 2]])


def test_episode_returns_and_greedy_envs_are_kept_apart():
  sink, out = _assembler(length=2, period=1)
  with _serving(sink=sink) as server:
    for st, reward in ((0, 0.0), (1, 1.0), (2, 2.0)):
      server.step(_request([0], 1, st, reward=reward))
      server.step(_request([3], 2, st, mode=Mode.EVAL, reward=10 * reward))
    assert server.acting.summary(Mode.TRAIN)['average_return'] == 3.0
    assert server.acting.summary(Mode.EVAL)['average_return'] == 30.0
    assert server.acting.env_steps(Mode.TRAIN) == 3 and server.acting.env_steps(Mode.EVAL) == 3
    # Greedy (evaluation) envs never reach the trajectories.
    assert all((o['observation'] == 0).all() for o in out)
    assert sum(len(o['action']) for o in out) == 2


def test_bad_request_fails_only_its_caller_while_batch_is_served():
  """Requests join one held-open batch in a fixed order, so the clash is certain."""
  results, errors = {}, {}
  requests = {
      'good_a': _request([0, 1], 1, 0),
      'bad_shape': make_request([4, 5], [3, 3], np.zeros((2, 3), np.float32), [0, 0],
                                [1, 1], [0, 0]),
      'clash': _request([0, 6], 4, 0),  # env 0 is already in this batch
      'good_b': _request([2, 3], 2, 0),  # fills the batch (6 envs): it runs
  }

  def call(name):
    try:
      results[name] = server.step(requests[name])
    except InvalidRequestError as e:
      errors[name] = str(e)

  threads = []
  with _serving(num_envs=8, max_batch_envs=6, batch_timeout_s=10.0) as server:
    for name, waiting in (('good_a', 2), ('bad_shape', 2), ('clash', 4), ('good_b', 0)):
      threads.append(threading.Thread(target=call, args=(name,)))
      threads[-1].start()
      deadline = time.monotonic() + 5
      while server.pending_envs() != waiting and time.monotonic() < deadline:
        time.sleep(0.001)
      if name == 'bad_shape':
        threads[-1].join(5)  # refused at validation, before the batch
      assert server.pending_envs() == waiting, name
    for t in threads:
      t.join(10)
  assert set(results) == {'good_a', 'good_b'} and set(errors) == {'bad_shape', 'clash'}
  assert 'observation has shape (2, 3)' in errors['bad_shape']
  assert 'env_ids [0] already have a step in flight' in errors['clash']
  assert server.requests_refused == 2
  assert server.batch_stats().batches == 1


def test_batch_fill_counts_every_env_and_never_exceeds_one():
  # 4 training envs and 2 evaluation envs in one batch: 6 of 6, not 6 of 4.
  with _serving(num_envs=6, max_batch_envs=6, batch_timeout_s=10.0) as server:
    threads = [threading.Thread(target=server.step, args=(_request(ids, 1, 0, mode=m),))
               for ids, m in (([0, 1], Mode.TRAIN), ([2, 3], Mode.TRAIN),
                              ([4, 5], Mode.EVAL))]
    for t in threads:
      t.start()
    for t in threads:
      t.join(10)
    stats = server.batch_stats()
  assert stats.batches == 1 and stats.units == 6
  assert stats.mean_batch_units / server.batch_capacity == 1.0


def test_policy_runs_once_per_batch_across_callers():
  policy = StepCountingPolicy()
  barrier = threading.Barrier(4)

  def call(i):
    barrier.wait()
    server.step(_request([2 * i, 2 * i + 1], i, 0))

  threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
  with _serving(8, policy=policy, max_batch_envs=8, batch_timeout_s=5.0) as server:
    for t in threads:
      t.start()
    for t in threads:
      t.join(10)
  assert policy.batch_sizes == [8]  # four actors, one forward pass


def test_vtrace_lstm_policy_keeps_recurrent_state_on_server():
  import tensorflow as tf  # noqa: F401  (real network, real variables)
  from seedacme.agents import vtrace
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(core='lstm', lstm_size=8))
  network = builder.make_networks(SPEC)
  policy = builder.make_policy(network, SPEC, num_train_envs=4, num_envs=4)
  with _serving(policy=policy) as server:
    server.step(_request([0, 1], 1, 0, obs=1.0))
    state_after_one = server.state_of([0, 1, 2, 3])
    assert state_after_one[0].shape == (4, 8)
    assert np.abs(state_after_one[0][:2]).sum() > 0  # envs 0, 1 advanced
    assert np.abs(state_after_one[0][2:]).sum() == 0  # envs 2, 3 untouched
    server.step(_request([0], 1, 0, obs=1.0))  # env 0 restarts its episode
    np.testing.assert_allclose(server.state_of([0])[0][0], state_after_one[0][0], rtol=1e-5)


def test_unknown_env_id_error_names_it():
  with _serving() as server:
    with pytest.raises(InvalidRequestError, match=r'env_ids \[4\] are unknown'):
      server.step(_request([4], 1, 0))
    assert server.step(_request([0], 1, 0))['action'].tolist() == [0]  # still serving


def test_a_group_with_a_bad_request_serves_the_others_and_refuses_only_it():
  """The shared-memory server's group of ready actors: merged when all are valid,
  one by one when one is not, so the refusal still names its own fault."""
  with _serving(num_envs=6, max_batch_envs=1) as server:
    good = _request([0, 1], 1, 0)
    nan = _request([2], 1, 0, obs=np.nan)
    foreign = _request([0], 1, 0)  # another actor's env
    evaluating = _request([5], 1, 0, mode=Mode.EVAL)
    owned = [range(0, 2), range(2, 3), range(3, 4), range(5, 6)]
    results = server.serve_group([good, nan, foreign, evaluating], owned)
    assert results[0]['action'].tolist() == [0, 0]
    assert isinstance(results[1], InvalidRequestError) and 'NaN' in str(results[1])
    assert isinstance(results[2], InvalidRequestError) and "not this actor's" in str(results[2])
    assert results[3]['action'].tolist() == [4]  # evaluation envs act 4 - count
    assert server.requests_refused == 2
    # All valid: one merged batch, each actor its own slice, modes kept per env.
    results = server.serve_group([_request([0, 1], 1, 1), _request([5], 1, 1, mode=Mode.EVAL)],
                                 [range(0, 2), range(5, 6)])
    assert [r['action'].tolist() for r in results] == [[1, 1], [3]]
    assert server.acting.env_steps(Mode.EVAL) == 2 and server.acting.env_steps(Mode.TRAIN) == 4
