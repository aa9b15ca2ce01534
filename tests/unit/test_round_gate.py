"""The inference server's round gate (issue 63, `seedacme.serving.rounds`): a training
batch is one call of every training env, in env-id order, however the requests arrive
and however long the last one takes; evaluation requests never share it; a round's
first call waits for the learner; a retried request or an actor restart is recorded
(`exact_until_round`), not hidden. And the policy's noise generator: the compiling
calls of `warm_up` and greedy evaluation batches leave the training envs' draws alone.
"""

import threading
import time

import numpy as np
import pytest

from seedacme.run.accounting import ActingLog
from seedacme.run.schedule import RoundClock, RoundSchedule
from seedacme.serving.policy import PolicyStep, ServerPolicy
from seedacme.serving.rounds import RoundGate
from seedacme.serving.server import InferenceServer
from seedacme.types import EnvSpec, Mode
from seedacme.wire.protocol import InvalidRequestError, make_request

SPEC = EnvSpec(observation_shape=(2,), observation_dtype='float32', num_actions=5)
TRAIN_ENVS, EVAL_ENVS = 4, 2


class RecordingPolicy(ServerPolicy):
  """Action = 100 * env id + that env's calls so far; records each batch's rows."""

  def __init__(self, num_envs):
    self.num_envs = num_envs
    self.batches = []
    self._calls = np.zeros(num_envs, np.int64)

  def step(self, env_ids, observation, reset, eval_mask):
    self.batches.append((env_ids.tolist(), bool(eval_mask.all()), bool(eval_mask.any())))
    action = (100 * env_ids + self._calls[env_ids]).astype(np.int32)
    self._calls[env_ids] += 1
    return PolicyStep(action, {}, ())

  def state_of(self, env_ids):
    return ()


class Stand:
  """A gated server over `RecordingPolicy`: 4 training envs, 2 evaluator envs, T = 2,
  B = 2 (two learner steps per round)."""

  def __init__(self, on_round=None, is_closed=lambda: False):
    self.clock = RoundClock()
    self.rounds_seen = []

    def hook(r):
      self.rounds_seen.append(r)
      return on_round(r) if on_round else None
    self.gate = RoundGate(RoundSchedule(TRAIN_ENVS, 2, 2), self.clock, on_round=hook,
                          is_closed=is_closed)
    self.policy = RecordingPolicy(TRAIN_ENVS + EVAL_ENVS)
    self.server = InferenceServer(self.policy, SPEC, TRAIN_ENVS + EVAL_ENVS,
                                  acting=ActingLog(), rounds=self.gate)

  def call(self, env_ids, run_id=1, step_type=1, mode=Mode.TRAIN):
    """Sends a request on its own thread (as an actor's Courier call); the thread has
    `.reply` once served."""
    k = len(env_ids)
    request = make_request(env_ids, np.full(k, run_id), np.zeros((k, 2), np.float32),
                           np.zeros(k), np.ones(k), np.full(k, step_type), mode)
    thread = threading.Thread(target=lambda: setattr(thread, 'reply',
                                                     self.server.step(request)),
                              daemon=True)
    thread.reply = None
    thread.start()
    return thread

  def round_of_calls(self, *groups, **kwargs):
    threads = [self.call(ids, **kwargs) for ids in groups]
    for t in threads:
      t.join(10)
      assert not t.is_alive()
    return [t.reply for t in threads]

  def close(self):
    self.server.shutdown()


@pytest.fixture
def stand():
  s = Stand()
  yield s
  s.close()


def _settle(s=0.3):
  time.sleep(s)


@pytest.mark.timeout(60)
def test_a_training_batch_is_every_training_env_once_in_env_id_order(stand):
  late = stand.call([2, 3])
  _settle()
  assert not stand.policy.batches and late.is_alive()  # no timeout serves half a round
  early = stand.call([1, 0])
  for t in (late, early):
    t.join(10)
  assert stand.policy.batches == [([0, 1, 2, 3], False, False)]
  # Each caller gets its own envs' actions, in its own order.
  np.testing.assert_array_equal(late.reply['action'], [200, 300])
  np.testing.assert_array_equal(early.reply['action'], [100, 0])
  assert stand.rounds_seen == [0]


@pytest.mark.timeout(60)
def test_evaluation_is_served_alone_while_a_round_forms(stand):
  waiting = stand.call([0, 1])
  _settle()
  (evaluated,) = stand.round_of_calls([4, 5], mode=Mode.EVAL)
  np.testing.assert_array_equal(evaluated['action'], [400, 500])
  assert stand.policy.batches == [([4, 5], True, True)]
  stand.round_of_calls([2, 3])
  waiting.join(10)
  assert stand.policy.batches[1] == ([0, 1, 2, 3], False, False)


@pytest.mark.timeout(60)
def test_a_rounds_first_call_waits_for_the_learner_steps_it_acts_after(stand):
  for _ in range(3):  # round 0: calls 0, 1, 2 (T = 2)
    stand.round_of_calls([0, 1], [2, 3])
  threads = [stand.call([0, 1]), stand.call([2, 3])]
  _settle()
  assert len(stand.policy.batches) == 3 and stand.rounds_seen == [0]
  stand.clock.note_learner_steps(1)
  _settle()
  assert len(stand.policy.batches) == 3  # round 1 acts after 2 steps (N / B)
  stand.clock.note_learner_steps(2)
  for t in threads:
    t.join(10)
  assert len(stand.policy.batches) == 4 and stand.rounds_seen == [0, 1]
  assert stand.gate.exact_until_round is None


@pytest.mark.timeout(60)
def test_a_wait_for_the_learner_ends_when_the_run_stops():
  closed = threading.Event()
  s = Stand(is_closed=closed.is_set)
  try:
    for _ in range(3):
      s.round_of_calls([0, 1], [2, 3])
    threads = [s.call([0, 1]), s.call([2, 3])]
    _settle()
    closed.set()
    for t in threads:
      t.join(10)
      assert 'shutting_down' in t.reply, t.reply
  finally:
    s.close()


@pytest.mark.timeout(60)
def test_the_round_hook_ends_the_run_at_a_rounds_start():
  s = Stand(on_round=lambda r: 'budget met' if r == 1 else None)
  try:
    for _ in range(3):
      s.round_of_calls([0, 1], [2, 3])
    s.clock.note_learner_steps(2)
    replies = s.round_of_calls([0, 1], [2, 3])
    assert all('budget met' in r['shutting_down'] for r in replies), replies
    assert s.server.round_stop == 'budget met' and len(s.policy.batches) == 3
  finally:
    s.close()


@pytest.mark.timeout(60)
def test_a_retried_request_waits_for_the_next_round_and_is_recorded(stand):
  first = stand.call([0, 1])
  _settle(0.1)
  retry = stand.call([0, 1])  # the same envs again (a Courier retry)
  _settle(0.1)
  stand.round_of_calls([2, 3])
  first.join(10)
  assert retry.is_alive()
  stand.round_of_calls([2, 3])
  retry.join(10)
  assert [b[0] for b in stand.policy.batches] == [[0, 1, 2, 3]] * 2
  assert stand.gate.exact_until_round == 0
  assert 'waited for the next' in stand.gate.not_exact_because


@pytest.mark.timeout(60)
def test_an_actor_restart_is_recorded_as_the_end_of_exactness(stand):
  stand.clock.note_learner_steps(100)
  for _ in range(4):  # into round 1
    stand.round_of_calls([0, 1], [2, 3])
  assert stand.gate.exact_until_round is None
  threads = [stand.call([0, 1], run_id=2, step_type=0), stand.call([2, 3])]
  for t in threads:
    t.join(10)
  assert 'action' in threads[0].reply
  assert stand.gate.exact_until_round == 1
  assert 'actor restarted (envs 0..1)' in stand.gate.not_exact_because


@pytest.mark.timeout(60)
def test_training_and_evaluation_requests_keep_to_their_envs(stand):
  with pytest.raises(InvalidRequestError, match=r'training request for env_ids \[4\]'):
    stand.server.step(make_request([3, 4], [1, 1], np.zeros((2, 2), np.float32),
                                   np.zeros(2), np.ones(2), np.ones(2)))
  with pytest.raises(InvalidRequestError, match=r'evaluation request for env_ids \[1\]'):
    stand.server.step(make_request([1], [1], np.zeros((1, 2), np.float32), np.zeros(1),
                                   np.ones(1), np.ones(1), Mode.EVAL))
  assert not stand.policy.batches


@pytest.mark.timeout(120)
def test_warm_up_and_greedy_batches_leave_the_training_noise_alone():
  """Two policies on one network: one compiles an extra bucket and serves evaluation
  batches between its training calls; both sample the same training actions."""
  from seedacme.agents import vtrace  # pylint: disable=g-import-not-at-top
  spec = EnvSpec((5,), 'float32', 3)
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(hidden_sizes=(8,), seed=7))
  network = builder.make_networks(spec)
  plain = builder.make_policy(network, spec, 16, 20)
  busy = builder.make_policy(network, spec, 16, 20)
  plain.warm_up([16])
  busy.warm_up([4, 8, 16])  # 4 x 4's buckets as well
  rng = np.random.default_rng(0)
  ids, train = np.arange(16), np.zeros(16, bool)
  got = {id(plain): [], id(busy): []}
  for n in range(6):
    observation = rng.normal(size=(16, 5)).astype(np.float32)
    for policy in (plain, busy):
      got[id(policy)].append(policy.step(ids, observation, np.full(16, n == 0), train).action)
    busy.step(np.arange(16, 20), observation[:4], np.full(4, n == 0), np.ones(4, bool))
  np.testing.assert_array_equal(np.stack(got[id(plain)]), np.stack(got[id(busy)]))
  # Not trivially equal: the draws do move the actions from call to call.
  assert len({a.tobytes() for a in got[id(plain)]}) > 1


def test_round_records_carry_the_budgets_and_a_fresh_run_starts_them_anew(tmp_path):
  """`RunMonitor.round_record`: one line per round in rounds.jsonl; the env-step
  budget and a training target end the run at a round's start, and the wall-clock
  records leave them to it."""
  import json  # pylint: disable=g-import-not-at-top
  from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
  from seedacme.run.monitor import RunMonitor, StopKind  # pylint: disable=g-import-not-at-top
  from seedacme.types import Episodes  # pylint: disable=g-import-not-at-top
  (tmp_path / 'rounds.jsonl').write_text('{"round": 99}\n')  # a previous run's
  config = ProgramConfig(num_actors=1, envs_per_actor=4, logdir=str(tmp_path),
                         reproducible=True, max_env_steps=100)
  acting = ActingLog()
  monitor = RunMonitor(config, acting, serving=None)
  monitor.restart_clock(0)
  assert monitor.round_record(0, 0, {}) is None
  acting.add_steps(Mode.TRAIN, 90)
  acting.add_episodes(Mode.TRAIN, Episodes(np.arange(3), np.array([1.0, 0.0, -1.0]),
                                           np.array([9, 9, 9])))
  # The wall-clock check does not end a reproducible run on its step budget.
  assert monitor.stop_reason({'env_steps': 120, 'elapsed_s': 1.0}, 5) is None
  assert monitor.round_record(1, 2, {'loss': 0.5}) is None
  acting.add_steps(Mode.TRAIN, 10)
  stop = monitor.round_record(2, 4, {'loss': 0.25})
  assert stop.kind is StopKind.ENV_STEPS and stop.value == 100
  lines = [json.loads(x) for x in (tmp_path / 'rounds.jsonl').read_text().splitlines()]
  assert [r['round'] for r in lines] == [0, 1, 2]
  assert lines[1] == {'round': 1, 'env_steps': 90, 'episodes': 3, 'average_return': 0.0,
                      'average_length': 9.0, 'average_over': 3, 'learner_steps': 2,
                      'learner_loss': 0.5}


@pytest.mark.timeout(60)
def test_shared_memory_actors_complete_a_round_together():
  """The shared-memory server's one loop must not wait in the gate itself: the request
  that completes a round is one only that loop can read (it hands each to a thread)."""
  from seedacme.actor.transport import InferencePath  # pylint: disable=g-import-not-at-top
  from seedacme.serving.shm_server import ShmServer  # pylint: disable=g-import-not-at-top
  from tests.unit.central_stand_ins import InProcessClient  # pylint: disable=g-import-not-at-top
  s = Stand()
  shm_server = ShmServer(s.server, SPEC, TRAIN_ENVS + EVAL_ENVS)
  client = InProcessClient(s.server, shm_server)
  stop = threading.Event()
  paths = [InferencePath(client, first, 2, stop, 'shm', f'actor {first}')
           for first in (0, 2, 4)]
  replies = {}

  def act(path, ids, mode):
    for n in range(3):
      k = len(ids)
      replies[(ids[0], n)] = path.step(
          np.asarray(ids), np.full(k, 1), np.zeros((k, 2), np.float32), np.zeros(k),
          np.ones(k), np.full(k, 0 if n == 0 else 1), mode)['action']
  try:
    threads = [threading.Thread(target=act, args=(p, ids, mode), daemon=True)
               for p, ids, mode in ((paths[0], [0, 1], Mode.TRAIN),
                                    (paths[1], [2, 3], Mode.TRAIN),
                                    (paths[2], [4, 5], Mode.EVAL))]
    for t in threads:
      t.start()
    for t in threads:
      t.join(20)
      assert not t.is_alive()
    assert all(p.name == 'shm' for p in paths)
    training = [b for b in s.policy.batches if not b[2]]
    assert [b[0] for b in training] == [[0, 1, 2, 3]] * 3
    assert all(b[1] for b in s.policy.batches if b[2])  # evaluation batches: alone
    np.testing.assert_array_equal(replies[(2, 2)], [202, 302])
    assert s.gate.exact_until_round is None
  finally:
    stop.set()
    for p in paths:
      p.close()
    shm_server.close()
    s.close()


def test_a_lagged_gate_sets_inference_weights_then_lets_the_learner_past_them():
  # 4 envs, T = 2, B = 2, lag 1: round r acts after 2 (r - 1) steps; the learner's
  # steps on round q's data (2q, 2q + 1) wait for round q + 1 to start.
  clock = RoundClock()
  events = []

  def hook(r):
    events.append(('hook', r, clock.round_started))
    return 'budget' if r == 3 else None
  gate = RoundGate(RoundSchedule(4, 2, 2, lag=1), clock, on_round=hook,
                   sync_weights=lambda: events.append(('sync', gate.round)))

  def serve(calls):
    for _ in range(calls):
      if not gate.before_call():
        return False
      gate.after_call()
    return True
  assert serve(3)  # round 0: calls 0..2
  assert events == [('sync', 0), ('hook', 0, -1)] and clock.round_started == 0
  assert not gate.learner_may_step(0, timeout=0.05)  # round 0's data waits for round 1
  assert serve(1)  # round 1's first call: S(1) = 0, no wait
  assert events[2:] == [('sync', 1), ('hook', 1, 0)] and clock.round_started == 1
  assert gate.learner_may_step(0) and gate.learner_may_step(1)
  assert not gate.learner_may_step(2, timeout=0.05)
  # Round 2 waits for S(2) = 2 steps: its weights are set after them, never before.
  started = threading.Thread(target=serve, args=(2,), daemon=True)
  started.start()
  time.sleep(0.2)
  assert started.is_alive() and len(events) == 4
  clock.note_learner_steps(2)
  started.join(5)
  assert events[4:] == [('sync', 2), ('hook', 2, 1)] and gate.learner_may_step(2)
  # The run ends at round 3's start: its weights are the final ones, and the learner
  # never trains on round 2's data (round 3 never starts).
  clock.note_learner_steps(4)
  assert not serve(2) and gate.stop == 'budget'
  assert events[6:] == [('sync', 3), ('hook', 3, 2)] and clock.round_started == 2
