"""Environments: specs, dm_env adapter for gymnasium, batched stepping with restarts."""

import dm_env
import gymnasium
import numpy as np
import pytest

from seedacme import envs
from seedacme.run.accounting import EpisodeTracker
from seedacme.actor.engines import BatchedEnv
from seedacme.envs.gym_adapter import GymnasiumEnv


def test_specs():
  assert envs.env_spec_of(envs.make_factory('catch')(0)) == envs.EnvSpec((10, 5), 'float32', 3)
  assert envs.env_spec_of(envs.make_factory('cartpole')(0)) == envs.EnvSpec((4,), 'float32', 2)
  with pytest.raises(ValueError, match="Unknown environment 'pong'"):
    envs.make_factory('pong')


def test_cartpole_termination_and_truncation_discounts():
  env = GymnasiumEnv(gymnasium.make('CartPole-v1', max_episode_steps=5), seed=0)
  ts = env.reset()
  assert ts.first() and ts.observation.dtype == np.float32
  steps = [env.step(0) for _ in range(5)]
  # Pushing left for 5 steps does not drop the pole: the time limit truncates.
  assert steps[-1].last() and steps[-1].discount == 1.0
  assert all(s.mid() for s in steps[:-1])
  assert env.step(0).first()  # stepping after LAST starts a new episode

  env = GymnasiumEnv(gymnasium.make('CartPole-v1', max_episode_steps=500), seed=0)
  env.reset()
  ts = env.step(0)
  while not ts.last():
    ts = env.step(0)
  assert ts.discount == 0.0  # the pole fell: a real termination


def test_batched_env_restarts_finished_episodes():
  k = 3
  batched = BatchedEnv(envs.make_factory('catch'), k, seed=0)
  ts = batched.reset()
  assert ts.observation.shape == (k, 10, 5) and (ts.step_type == 0).all()
  finished_returns, types = [], []
  episodes = EpisodeTracker(k)  # the env reports step types and rewards; this adds up
  for _ in range(25):
    ts = batched.step(np.zeros(k, np.int32))
    types.append(ts.step_type.copy())
    finished_returns += episodes.observe(np.arange(k), ts.step_type, ts.reward).returns.tolist()
  types = np.array(types)
  # Catch episodes last 9 steps: LAST at step 9, FIRST (restart) at step 10, LAST at 19...
  assert (types[8] == int(dm_env.StepType.LAST)).all()
  assert (types[9] == int(dm_env.StepType.FIRST)).all()
  assert (types[18] == int(dm_env.StepType.LAST)).all()
  assert len(finished_returns) == 2 * k and set(finished_returns) <= {-1.0, 1.0}
  with pytest.raises(ValueError, match='expected actions of shape'):
    batched.step(np.zeros(2))


def test_seeds_make_envs_differ_and_repeat():
  a = BatchedEnv(envs.make_factory('cartpole'), 2, seed=5).reset().observation
  b = BatchedEnv(envs.make_factory('cartpole'), 2, seed=5).reset().observation
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a[0], a[1])
