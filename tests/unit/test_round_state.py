"""The parts of a round checkpoint (issue 63 Deliver 3, `seedacme.run.resume`), each
saved and loaded into a fresh copy that must then go on exactly as the original:
the trajectory assembler's partial unrolls, the episode trackers and the acting
log's window, a TF policy's recurrent state and noise generator, the inference
server with its round gate (restored envs take their actors' new run ids without
starting over; a restarted actor later is still one), the envs of `BatchedEnv`
(Catch, CartPole; an env that does not pickle is refused by name), and the
arithmetic of which calls are checkpoint rounds' first.
"""

import pickle
import threading

import gymnasium
import numpy as np
import pytest
import tree

from seedacme import envs
from seedacme.actor.engines import BatchedEnv, EnvSnapshotError, Lockstep
from seedacme.agents import registry, vtrace
from seedacme.envs.gym_adapter import GymnasiumEnv
from seedacme.run.accounting import ActingLog, EpisodeTracker
from seedacme.run.resume import (ActorSnapshots, EnvSnapshots, RoundCheckpoints,
                                 checkpoint_round)
from seedacme.run.schedule import RoundClock, RoundSchedule
from seedacme.serving.policy import PolicyStep, ServerPolicy
from seedacme.serving.rounds import RoundGate
from seedacme.serving.server import InferenceServer
from seedacme.trajectories.assembler import SequenceAssembler
from seedacme.types import EnvSpec, Episodes, Mode
from seedacme.wire.protocol import make_request


def _steps(rng, n_envs, count):
  return [{'observation': rng.normal(size=(n_envs, 3)).astype(np.float32),
           'action': rng.integers(0, 4, size=n_envs).astype(np.int32),
           'extras': {'logits': rng.normal(size=(n_envs, 4)).astype(np.float32)}}
          for _ in range(count)]


def test_assembler_state_continues_the_same_unrolls():
  rng = np.random.default_rng(0)
  out_a, out_b = [], []
  a = SequenceAssembler(4, length=5, period=4, on_sequences=out_a.append)
  for step in _steps(rng, 4, 9):  # two unrolls each, then one step kept
    a.add(np.arange(4), step)
  saved = pickle.loads(pickle.dumps(a.state()))
  b = SequenceAssembler(4, length=5, period=4, on_sequences=out_b.append)
  b.load_state(saved)
  assert b.sequences_emitted == a.sequences_emitted == 8
  out_a.clear()
  for step in _steps(rng, 4, 8):
    a.add(np.arange(4), step)
    b.add(np.arange(4), step)
  assert len(out_a) == len(out_b) == 2
  for x, y in zip(out_a, out_b):
    tree.map_structure(np.testing.assert_array_equal, x, y)
  with pytest.raises(ValueError, match='assembler state'):
    SequenceAssembler(3, length=5, period=4, on_sequences=print).load_state(saved)


def test_episode_tracker_and_acting_log_continue_their_episodes_and_window():
  tracker, log = EpisodeTracker(3), ActingLog(window=4)
  ids = np.arange(3)
  tracker.observe(ids, np.array([0, 0, 0]), np.zeros(3))
  tracker.observe(ids, np.array([1, 1, 1]), np.array([1.0, 2.0, 3.0]))
  for r in (1.0, 2.0, 3.0, 4.0, 5.0):
    log.add_episodes(Mode.TRAIN, Episodes(np.array([0]), np.array([r]), np.array([2])))
  log.add_steps(Mode.TRAIN, 17)
  other_tracker, other_log = EpisodeTracker(3), ActingLog(window=4)
  other_tracker.load_state(pickle.loads(pickle.dumps(tracker.state())))
  other_log.load_train_state(pickle.loads(pickle.dumps(log.train_state())))
  last = (ids, np.array([2, 1, 2]), np.array([1.0, 1.0, 1.0]))
  a, b = tracker.observe(*last), other_tracker.observe(*last)
  np.testing.assert_array_equal(a.returns, b.returns)
  np.testing.assert_array_equal(b.returns, [2.0, 4.0])
  assert other_log.summary(Mode.TRAIN) == log.summary(Mode.TRAIN)
  assert other_log.summary(Mode.TRAIN)['average_return'] == 3.5  # 2..5
  assert other_log.env_steps() == 17


@pytest.mark.parametrize('core', ['feedforward', 'lstm'])
def test_tf_policy_acting_state_continues_the_same_actions(core):
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  builder = vtrace.VTraceBuilder(registry.make_config('vtrace', 'catch', core=core,
                                                     seed=5))
  network = builder.make_networks(spec)
  a = builder.make_policy(network, spec, 4, 4)
  b = builder.make_policy(network, spec, 4, 4)
  rng = np.random.default_rng(1)
  ids, train = np.arange(4), np.zeros(4, bool)
  obs = [rng.random((4,) + spec.observation_shape).astype(spec.dtype) for _ in range(8)]
  for o in obs[:3]:
    a.step(ids, o, np.zeros(4, bool), train)
  b.load_acting_state(ids, pickle.loads(pickle.dumps(a.acting_state(ids))))
  for o in obs[3:]:
    x = a.step(ids, o, np.zeros(4, bool), train)
    y = b.step(ids, o, np.zeros(4, bool), train)
    np.testing.assert_array_equal(x.action, y.action)
    np.testing.assert_array_equal(x.extras['logits'], y.extras['logits'])
    tree.map_structure(np.testing.assert_array_equal, x.state, y.state)


class CountingPolicy(ServerPolicy):
  """Action = that env's calls so far (mod 5); its state is the per-env count and a
  shared draw counter, both saved in its acting state."""

  def __init__(self, num_envs):
    self.num_envs = num_envs
    self.counts = np.zeros(num_envs, np.int64)
    self.draws = 0
    self.resets = []

  def step(self, env_ids, observation, reset, eval_mask):
    self.resets.append(env_ids[reset].tolist())
    self.counts[env_ids[reset]] = 0
    action = (self.counts[env_ids] % 5).astype(np.int32)
    self.counts[env_ids] += 1
    self.draws += 1
    return PolicyStep(action, {}, ())

  def state_of(self, env_ids):
    return ()

  def acting_state(self, env_ids):
    return {'counts': self.counts[env_ids].copy(), 'draws': self.draws}

  def load_acting_state(self, env_ids, state):
    self.counts[env_ids] = state['counts']
    self.draws = state['draws']


SPEC = EnvSpec(observation_shape=(2,), observation_dtype='float32', num_actions=5)


class Stand:
  """A gated server over `CountingPolicy`: 4 training envs, T = 2, B = 4, with an
  assembler of unrolls as its sink."""

  def __init__(self):
    self.clock = RoundClock()
    self.gate = RoundGate(RoundSchedule(4, 2, 4), self.clock)
    self.policy = CountingPolicy(4)
    self.unrolls = []
    self.sink = _Sink(SequenceAssembler(4, 3, 2, self.unrolls.append))
    self.server = InferenceServer(self.policy, SPEC, 4, self.sink, acting=ActingLog(),
                                  rounds=self.gate)

  def call_all(self, run_id=1, step_type=1):
    """One call of every env, two actors of two envs, on their own threads."""
    replies = [None, None]

    def send(i):
      ids = np.arange(2 * i, 2 * i + 2)
      replies[i] = self.server.step(make_request(
          ids, np.full(2, run_id), np.zeros((2, 2), np.float32), np.ones(2), np.ones(2),
          np.full(2, step_type)))
    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(10)
    return np.concatenate([r['action'] for r in replies])


class _Sink:
  def __init__(self, assembler):
    self.assembler = assembler

  def add(self, env_ids, step):
    self.assembler.add(env_ids, step)

  def reset(self, env_ids):
    self.assembler.reset(env_ids)

  def state(self):
    return self.assembler.state()

  def load_state(self, state):
    self.assembler.load_state(state)

  def close(self):
    pass


def test_server_round_state_continues_at_the_round_as_the_uninterrupted_server():
  a = Stand()
  a.clock.note_learner_steps(100)  # no barrier waits
  a.call_all(step_type=0)
  for _ in range(4):  # calls 1..4: rounds 0 and 1 done; round 2 starts at call 5
    a.call_all()
  assert a.gate.calls == 5
  saved = pickle.loads(pickle.dumps(a.server.round_state()))
  assert saved['round'] == 2 and saved['missing'] == []
  b = Stand()
  b.clock.note_learner_steps(100)
  b.server.restore_round_state(saved)
  assert b.server.restored_envs(np.arange(4)).all()
  assert b.gate.calls == 5 and b.gate.round == 1
  a.unrolls.clear()
  for _ in range(4):  # the resumed actors have a new run id: taken, not a restart
    np.testing.assert_array_equal(a.call_all(), b.call_all(run_id=7))
  assert b.policy.resets[-4:] == [[]] * 4 and b.server.actor_restarts == 0
  assert not b.server.restored_envs(np.arange(4)).any()
  assert b.gate.round == a.gate.round == 3 and b.gate.exact_until_round is None
  assert len(a.unrolls) == len(b.unrolls) == 2
  for x, y in zip(a.unrolls, b.unrolls):
    tree.map_structure(np.testing.assert_array_equal, x, y)
  assert b.server.acting.env_steps() == a.server.acting.env_steps() == 36
  b.call_all(run_id=8)  # a later restart is one: recorded, not hidden
  assert b.server.actor_restarts == 1 and b.gate.exact_until_round == 4  # call 9


def test_a_policy_without_acting_state_is_named_as_missing():
  gate = RoundGate(RoundSchedule(4, 2, 4), RoundClock())

  class Plain(CountingPolicy):
    acting_state = ServerPolicy.acting_state
  server = InferenceServer(Plain(4), SPEC, 4, acting=ActingLog(), rounds=gate)
  assert server.round_state()['missing'] == ['policy']


@pytest.mark.parametrize('env', ['catch', 'cartpole', 'mujoco', 'atari'])
def test_batched_env_snapshot_continues_the_same_episodes(env):
  if env == 'mujoco':
    pytest.importorskip('mujoco')
  factory = envs.make_factory(env, **({'game': 'Breakout'} if env == 'atari' else {}))
  a = BatchedEnv(factory, 3, seed=11)
  spec = a.spec
  rng = np.random.default_rng(2)

  def actions():
    if spec.continuous:  # Hopper-v5: it falls within tens of steps, then resets
      return rng.uniform(-1, 1, (3,) + tuple(spec.action_shape)).astype(np.float32)
    return rng.integers(0, spec.num_actions, size=3).astype(np.int32)
  a.reset()
  for _ in range(25):  # episodes end and restart on the way
    a.step(actions())
  blobs = a.snapshot()
  b = Lockstep(BatchedEnv(factory, 3, seed=99))
  b.recv()
  b.restore(blobs)
  np.testing.assert_array_equal(b.recv().step.observation, a._batch().observation)  # pylint: disable=protected-access
  for _ in range(300 if env == 'atari' else 60):  # Breakout: a life lost or two
    act = actions()
    x = a.step(act)
    b.send(act)
    y = b.recv().step
    for field in ('observation', 'reward', 'discount', 'step_type'):
      np.testing.assert_array_equal(getattr(x, field), getattr(y, field))


class _Unpicklable:
  """A dm_env-like env holding a lock (does not pickle)."""

  def __init__(self, seed):
    self.inner = envs.make_factory('catch')(seed)
    self.lock = threading.Lock()

  def __getattr__(self, name):
    return getattr(self.inner, name)


class _ByArguments(gymnasium.Env, gymnasium.utils.EzPickle):
  """A gymnasium env that pickles by its constructor arguments (its state would be
  lost)."""
  observation_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
  action_space = gymnasium.spaces.Discrete(2)

  def __init__(self):
    gymnasium.utils.EzPickle.__init__(self)

  def reset(self, seed=None, options=None):
    super().reset(seed=seed)
    return np.zeros(2, np.float32), {}

  def step(self, action):
    return np.zeros(2, np.float32), 0.0, False, False, {}


def test_an_env_that_pickles_by_its_arguments_is_refused_by_name():
  engine = BatchedEnv(lambda seed: GymnasiumEnv(_ByArguments(), seed=seed), 2)
  engine.reset()
  with pytest.raises(EnvSnapshotError, match=r'_ByArguments pickles by its constructor'):
    engine.snapshot()


def test_atari_with_sticky_actions_is_refused_by_name():
  engine = BatchedEnv(envs.make_factory('atari', game='Pong', repeat_action_probability=0.25),
                      1)
  engine.reset()
  with pytest.raises(EnvSnapshotError, match=r'sticky actions \(repeat_action_probability=0.25\)'):
    engine.snapshot()


def test_an_env_that_does_not_pickle_is_named():
  engine = BatchedEnv(_Unpicklable, 2, seed=0)
  engine.reset()
  with pytest.raises(EnvSnapshotError, match=r'env 0 .*cannot be pickled'):
    engine.snapshot()


def test_checkpoint_rounds_first_calls():
  # T = 10, every 5 rounds: round 5 starts at call 51, round 10 at 101.
  due = [n for n in range(0, 160) if checkpoint_round(n, 10, 5) is not None]
  assert due == [51, 101, 151]
  assert checkpoint_round(101, 10, 5) == 10
  assert checkpoint_round(0, 10, 1) is None and checkpoint_round(11, 10, 1) == 1


def test_env_snapshots_say_what_is_missing_and_actors_hand_theirs_in():
  snaps = EnvSnapshots(4)
  sent = []
  actor = ActorSnapshots([0, 1], 2, 1, send=lambda *a: (sent.append(a), snaps.offer(*a)),
                         fetch=lambda ids: None)
  engine = Lockstep(BatchedEnv(envs.make_factory('catch'), 2, seed=0))
  engine.recv()
  actor.maybe_save(2, engine)  # not a round's first call
  assert not sent
  actor.maybe_save(3, engine)  # round 1's
  assert sent[0][0] == 1 and len(sent[0][2]) == 2
  blobs, why = snaps.take(1)
  assert sorted(blobs) == [0, 1] and why == 'no snapshot of envs [2, 3] at round 1'
  ActorSnapshots([2, 3], 2, 1, send=snaps.offer, fetch=lambda ids: None).maybe_save(
      5, object())  # an engine without snapshot: said, by env ids
  blobs, why = snaps.take(2)
  assert blobs == {} and why.startswith('envs 2..3: engine object cannot snapshot')
  with pytest.raises(ValueError, match='training envs are 0..3'):
    snaps.offer(1, [4], [b''])


def test_round_checkpoints_find_by_learner_steps_and_keep_the_newest(tmp_path):
  store = RoundCheckpoints(str(tmp_path), keep=2)
  for r in (5, 10, 15):
    store.write(r, {'round': r, 'learner_steps': 3 * r})
  assert store.find(45)['round'] == 15 and store.find(30)['round'] == 10
  assert store.find(15) is None  # dropped (keep=2)
  assert store.find(7) is None
