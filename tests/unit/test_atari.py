"""Atari preprocessing: shapes and dtypes, raw scores, no-op starts, sticky actions."""

import dm_env
import numpy as np
import pytest

from seedacme import envs
from seedacme.envs import atari


@pytest.fixture(scope='module')
def pong():
  return envs.make_factory('atari', game='Pong')


def test_spec_and_observations(pong):
  env = pong(0)
  assert envs.env_spec_of(env) == envs.EnvSpec((84, 84, 4), 'uint8', 6)
  ts = env.reset()
  assert ts.first() and ts.observation.shape == (84, 84, 4) and ts.observation.dtype == np.uint8
  ts = env.step(0)
  # Frames stack along the last axis: the newest frame is the last channel.
  assert ts.observation.shape == (84, 84, 4)
  assert not np.array_equal(ts.observation[..., -1], np.zeros((84, 84), np.uint8))


def test_raw_scores_are_not_clipped():
  env = envs.make_factory('atari', game='Boxing')(0)
  env.reset()
  rng = np.random.RandomState(1)
  rewards = [env.step(rng.randint(18)).reward for _ in range(600)]
  # Boxing awards 2 points for a long punch: a clipped env would never report |r| > 1.
  assert max(abs(r) for r in rewards) > 1.0


def test_noop_starts_differ_with_seed_and_repeat_with_it(pong):
  first = [pong(s).reset().observation for s in (0, 1, 0)]
  np.testing.assert_array_equal(first[0], first[2])
  # Different seeds draw different numbers of no-ops: the ball is elsewhere.
  assert any(not np.array_equal(pong(s).reset().observation, first[0]) for s in range(1, 6))


def test_sticky_actions_default_off_and_configurable():
  plain = atari.make_atari_gymnasium('Pong')
  sticky = atari.make_atari_gymnasium('Pong', repeat_action_probability=0.25)
  assert plain.unwrapped.ale.getFloat('repeat_action_probability') == 0.0
  assert sticky.unwrapped.ale.getFloat('repeat_action_probability') == 0.25


def test_episode_ends_with_last_step():
  env = envs.make_factory('atari', game='Pong')(3)
  ts = env.reset()
  rng = np.random.RandomState(0)
  total = 0.0
  for _ in range(5000):
    ts = env.step(rng.randint(6))
    total += ts.reward
    if ts.last():
      break
  assert ts.step_type == dm_env.StepType.LAST and ts.discount == 0.0
  assert -21 <= total < 0  # a random policy loses Pong; the score is raw
