"""ale-py's C++ vector engine (envs/atari_vector.py) against the per-env Python loop."""

import pickle

import dm_env
import numpy as np
import pytest

from seedacme import envs
from seedacme.run.accounting import EpisodeTracker
from seedacme.envs import atari_vector
from seedacme.envs.atari_vector import AtariVectorEnv, AtariVectorHalves
from seedacme.actor.engines import BatchedEnv
from seedacme.actor.engines import make_engine
from seedacme.envs.registry import AtariFactory

FIRST, MID, LAST = (int(dm_env.StepType.FIRST), int(dm_env.StepType.MID),
                    int(dm_env.StepType.LAST))


def _with_episodes(engine):
  """`engine.step` that also returns the episodes it ended, as the actor accounts them
  (`seedacme.run.accounting.EpisodeTracker`; the engines report step types and rewards)."""
  tracker, ids = EpisodeTracker(engine.num_envs), np.arange(engine.num_envs)

  def step(actions):
    ts = engine.step(actions)
    return ts, tracker.observe(ids, ts.step_type, ts.reward)
  return step


def test_shapes_dtypes_and_first_steps():
  engine = AtariVectorEnv('Pong', 3, seed=0)
  try:
    assert engine.spec == envs.EnvSpec((84, 84, 4), 'uint8', 6)
    assert engine.spec == envs.env_spec_of(envs.make_factory('atari')(0))
    ts = engine.reset()
    assert ts.observation.shape == (3, 84, 84, 4) and ts.observation.dtype == np.uint8
    assert ts.reward.dtype == np.float32 and ts.discount.dtype == np.float32
    assert ts.step_type.dtype == np.int8 and (ts.step_type == FIRST).all()
    assert (ts.reward == 0).all() and (ts.discount == 1).all()
    # An episode's first observation is its first frame four times (as gymnasium's
    # FrameStackObservation pads), not ale-py's zero padding.
    for c in range(3):
      np.testing.assert_array_equal(ts.observation[..., c], ts.observation[..., 3])
    assert ts.observation[..., 3].any()
    ts, finished = _with_episodes(engine)(np.zeros(3, np.int32))
    assert (ts.step_type == MID).all() and finished.returns.tolist() == []
    with pytest.raises(ValueError, match='expected 3 actions'):
      engine.step(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r'actions must be in \[0, 6\)'):
      engine.step(np.array([0, 6, 0]))
  finally:
    engine.close()


def _assert_same(a, b, where):
  for name, x, y in zip(a._fields, a, b):
    assert x.dtype == y.dtype, (where, name, x.dtype, y.dtype)
    np.testing.assert_array_equal(x, y, err_msg=f'{where}: {name}')


def test_identical_to_the_python_loop_through_episode_ends():
  """No no-ops and no sticky actions: the two engines must agree bit for bit.

  Same grayscale palette, same max-pool of the last two frames, same cv2 INTER_AREA
  resize, same frame stack (after the padding fix), raw rewards, and the same LAST ->
  FIRST restarts. Pong with these actions ends its episodes at steps 990 and 1048.
  """
  k = 2
  python = BatchedEnv(envs.make_factory('atari', noop_max=0), k, seed=0)
  vector = AtariVectorEnv('Pong', k, seed=0, noop_max=0, num_threads=1)
  try:
    _assert_same(python.reset(), vector.reset(), 'reset')
    python_step, vector_step = _with_episodes(python), _with_episodes(vector)
    rng = np.random.RandomState(0)
    types, episodes = [], []
    for t in range(1060):
      actions = rng.randint(6, size=k)
      (a, a_done), (b, b_done) = python_step(actions), vector_step(actions)
      _assert_same(a, b, f'step {t}')
      _assert_same(a_done, b_done, f'episodes at step {t}')
      types.append(b.step_type)
      episodes += b_done.returns.tolist()
    types = np.array(types)
    assert episodes == [-20.0, -20.0]
    for env in range(k):
      ends = np.flatnonzero(types[:, env] == LAST)
      assert len(ends) == 1
      assert types[ends[0] + 1, env] == FIRST  # the restart, whatever the action was
  finally:
    python.close()
    vector.close()


def test_restart_ignores_the_action_and_truncation_keeps_the_discount():
  # 200 frames = 50 agent steps: a truncation, so discount 1 on the LAST step.
  engine = AtariVectorEnv('Pong', 2, seed=0, noop_max=0, max_episode_frames=200)
  try:
    start = engine.reset().observation
    step = _with_episodes(engine)
    for _ in range(49):
      ts, finished = step(np.array([2, 3]))
      assert (ts.step_type == MID).all()
    ts, finished = step(np.array([2, 3]))
    assert (ts.step_type == LAST).all() and (ts.discount == 1).all()
    assert finished.lengths.tolist() == [50, 50] and len(finished.returns) == 2
    ts, finished = step(np.array([5, 4]))  # ignored: the envs restart
    assert (ts.step_type == FIRST).all() and (ts.reward == 0).all()
    assert finished.returns.tolist() == []
    np.testing.assert_array_equal(ts.observation, start)  # no no-ops: the same start
  finally:
    engine.close()


def test_termination_has_discount_zero():
  engine = AtariVectorEnv('Pong', 1, seed=0, noop_max=0)
  rng = np.random.RandomState(0)
  try:
    engine.reset()
    step = _with_episodes(engine)
    for _ in range(2000):
      ts, finished = step(rng.randint(6, size=1))
      if ts.step_type[0] == LAST:
        break
    assert ts.step_type[0] == LAST and ts.discount[0] == 0.0
    assert -21 <= finished.returns[0] < 0  # raw score, not clipped
  finally:
    engine.close()


def test_noop_starts_follow_the_seed():
  def after_20_steps(seed):
    # Pong's first frames hardly change during the no-ops; 20 steps later the ball and
    # the opponent's paddle show how far each env's episode had run.
    engine = AtariVectorEnv('Pong', 6, seed=seed)
    try:
      engine.reset()
      for _ in range(20):
        ts = engine.step(np.zeros(6, np.int32))
      return ts.observation
    finally:
      engine.close()

  a = after_20_steps(0)
  np.testing.assert_array_equal(a, after_20_steps(0))
  assert any(not np.array_equal(a[0], a[i]) for i in range(1, 6))
  assert not np.array_equal(after_20_steps(100), a)


def test_sticky_actions_are_seeded_and_change_the_game():
  def play(probability):
    engine = AtariVectorEnv('Pong', 2, seed=3, noop_max=0,
                            repeat_action_probability=probability)
    rng = np.random.RandomState(0)
    try:
      engine.reset()
      return np.stack([engine.step(rng.randint(6, size=2)).observation
                       for _ in range(150)])
    finally:
      engine.close()

  sticky = play(0.25)
  np.testing.assert_array_equal(sticky, play(0.25))
  assert not np.array_equal(sticky, play(0.0))


def test_halves_return_every_envs_steps_in_order():
  """Async: each env's timesteps, read by slot, are those of the synchronous engine.

  Without no-ops or sticky actions an env's trajectory depends only on its own actions,
  so giving each env the n-th action of its own sequence must reproduce the sync run.
  """
  k, steps = 4, 120
  plans = np.random.RandomState(1).randint(6, size=(k, steps + 1))
  reference = AtariVectorEnv('Pong', k, seed=0, noop_max=0)
  halves = AtariVectorHalves('Pong', k, seed=0, noop_max=0)
  try:
    assert halves.batch_size == 2
    expected = [reference.reset()]
    for t in range(steps):
      expected.append(reference.step(plans[:, t]))
    seen = [[] for _ in range(k)]
    while min(len(s) for s in seen) <= steps:
      batch = halves.recv()
      assert len(batch.slots) == 2 and len(set(batch.slots.tolist())) == 2
      for j, slot in enumerate(batch.slots):
        seen[slot].append((batch.step.observation[j], batch.step.reward[j],
                           batch.step.discount[j], batch.step.step_type[j]))
      halves.send(np.array([plans[s, min(len(seen[s]) - 1, steps)] for s in batch.slots]))
    for slot in range(k):
      for t in range(steps + 1):
        obs, reward, discount, step_type = seen[slot][t]
        np.testing.assert_array_equal(obs, expected[t].observation[slot])
        assert (reward, discount, step_type) == (
            expected[t].reward[slot], expected[t].discount[slot],
            expected[t].step_type[slot]), (slot, t)
    with pytest.raises(RuntimeError, match='without send'):
      halves.recv()
      halves.recv()
  finally:
    reference.close()
    halves.close()


def test_engine_selection_through_the_factory():
  factory = envs.make_factory('atari', game='Pong', engine='vector_async', num_threads=1)
  assert isinstance(factory, AtariFactory)
  assert pickle.loads(pickle.dumps(factory)) == factory
  assert envs.env_spec_of(factory(0)) == envs.EnvSpec((84, 84, 4), 'uint8', 6)
  for engine, kind in (('python', BatchedEnv), ('vector_sync', AtariVectorEnv),
                       ('vector_async', AtariVectorHalves)):
    built = make_engine(envs.make_factory('atari', engine=engine), 2, seed=0)
    try:
      assert type(built) is kind and built.num_envs == 2
    finally:
      built.close()
  assert type(make_engine(envs.make_factory('catch'), 2)) is BatchedEnv
  with pytest.raises(ValueError, match='only atari has vector engines'):
    envs.make_factory('catch', engine='vector_sync')
  with pytest.raises(ValueError, match='unknown env engine'):
    envs.make_factory('atari', engine='envpool')


def test_rom_names():
  assert atari_vector.rom_name('Pong') == 'pong'
  assert atari_vector.rom_name('MsPacman') == 'ms_pacman'
  assert atari_vector.rom_name('SpaceInvaders') == 'space_invaders'
  assert atari_vector.rom_name('space_invaders') == 'space_invaders'
