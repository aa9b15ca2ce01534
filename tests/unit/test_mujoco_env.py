"""MuJoCo tasks through the gymnasium adapter: continuous specs, episode ends, bad actions.

The discounts are what the learners bootstrap on: a time limit (HalfCheetah never
terminates) is LAST with discount 1, a fall (Hopper) LAST with discount 0. Each test
makes its envs afresh and takes well under a second.
"""

import gymnasium
import numpy as np
import pytest

from seedacme import envs
from seedacme.envs.gym_adapter import GymnasiumEnv


@pytest.mark.parametrize('level, obs_size, action_size',
                         [('HalfCheetah-v5', 17, 6), ('Hopper-v5', 11, 3)])
def test_spec_is_continuous(level, obs_size, action_size):
  env = envs.make_factory('mujoco', level=level)(0)
  spec = envs.env_spec_of(env)
  assert spec == envs.EnvSpec((obs_size,), 'float32', 0, action_shape=(action_size,),
                              action_minimum=(-1.0,) * action_size,
                              action_maximum=(1.0,) * action_size)
  assert spec.continuous and spec.action_dtype == np.float32
  ts = env.reset()
  assert ts.first() and ts.observation.dtype == np.float32
  assert ts.observation.shape == (obs_size,)
  env.close()


def test_default_level_is_half_cheetah():
  spec = envs.env_spec_of(envs.make_factory('mujoco')(0))
  assert spec.observation_shape == (17,) and spec.action_shape == (6,)


def test_time_limit_truncates_with_discount_one():
  env = envs.make_factory('mujoco', level='HalfCheetah-v5', max_episode_steps=5)(0)
  env.reset()
  rng = np.random.default_rng(0)
  steps = [env.step(rng.uniform(-1, 1, 6).astype(np.float32)) for _ in range(5)]
  assert all(s.mid() for s in steps[:-1])
  assert steps[-1].last() and steps[-1].discount == 1.0  # bootstrapped, not terminal
  assert env.step(np.zeros(6, np.float32)).first()  # the next step restarts


def test_hopper_fall_terminates_with_discount_zero():
  env = envs.make_factory('mujoco', level='Hopper-v5')(0)
  env.reset()
  action = np.ones(3, np.float32)  # full torque on every joint: falls in ~20 steps
  for _ in range(200):  # well before the 1000-step time limit
    ts = env.step(action)
    if ts.last():
      break
  assert ts.last() and ts.discount == 0.0


@pytest.mark.parametrize('bad', [[1.5, 0, 0, 0, 0, 0], [np.nan, 0, 0, 0, 0, 0],
                                 [0, 0, 0, 0, 0, -np.inf], [0.0] * 5])
def test_bad_action_raises_and_does_not_step(bad):
  gym_env = gymnasium.make('HalfCheetah-v5')
  env = GymnasiumEnv(gym_env, seed=0)
  env.reset()
  data = gym_env.unwrapped.data
  time, qpos = float(data.time), data.qpos.copy()
  with pytest.raises(ValueError, match='HalfCheetah-v5'):
    env.step(np.asarray(bad, np.float32))
  assert data.time == time and np.array_equal(data.qpos, qpos)  # not stepped
  assert env.step(np.zeros(6, np.float32)).mid()  # a good action still steps


def test_actions_on_the_bounds_and_of_other_dtypes_step():
  env = envs.make_factory('mujoco', level='Hopper-v5')(0)
  env.reset()
  assert env.step(np.array([-1.0, 1.0, 0.0], np.float64)).mid()
  assert env.step([[1.0, -1.0, 0.5]]).mid()  # reshaped to the space's shape


def test_discrete_cartpole_still_discrete():
  env = envs.make_factory('cartpole')(0)
  spec = envs.env_spec_of(env)
  assert spec == envs.EnvSpec((4,), 'float32', 2) and not spec.continuous
  env.reset()
  assert env.step(np.int32(1)).mid()


def test_seeds_repeat_and_differ():
  first = [envs.make_factory('mujoco', level='Hopper-v5')(seed).reset().observation
           for seed in (3, 3, 4)]
  np.testing.assert_array_equal(first[0], first[1])
  assert not np.array_equal(first[0], first[2])


def test_ant_leaves_its_contact_forces_out_unless_asked_and_other_tasks_have_none():
  """Ant-v5's gymnasium default observation holds 78 dims of contact forces (105 in
  all); seedacme's default leaves them out (27 dims, v4's default: issue 51), the
  option puts them back, and asking for them on a task without any is named."""
  from seedacme.envs import registry  # pylint: disable=g-import-not-at-top
  default = registry.make_factory('mujoco', level='Ant-v5')(0)
  with_forces = registry.make_factory('mujoco', level='Ant-v5', contact_forces=True)(0)
  without = registry.make_factory('mujoco', level='Ant-v5', contact_forces=False)(0)
  assert default.observation_spec().shape == (27,)
  assert without.observation_spec().shape == (27,)
  assert with_forces.observation_spec().shape == (105,)
  assert default.reset().observation.shape == (27,)
  assert registry.factory_options('mujoco', level='Ant-v5')['contact_forces'] is None
  cheetah = registry.make_factory('mujoco', level='HalfCheetah-v5', contact_forces=False)(0)
  assert cheetah.observation_spec().shape == (17,)
  with pytest.raises(ValueError, match=r"contact_forces=True: the MuJoCo task 'HalfCheetah-v5'"):
    registry.make_factory('mujoco', level='HalfCheetah-v5', contact_forces=True)(0)
