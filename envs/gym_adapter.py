"""Gymnasium (>= 1.0) environments as dm_env environments.

Discrete actions (CartPole) become a `DiscreteArray`; float `Box` actions (MuJoCo:
HalfCheetah-v5, Hopper-v5, ...) a float32 `BoundedArray` with the space's bounds.
Continuous actions are not clipped: the policy keeps them inside the bounds, and one
outside them or not finite raises `ValueError` before it reaches the env. Observations
are float32 (MuJoCo returns float64).

Episode ends map to dm_env's conventions: `terminated` (Hopper falls) gives a LAST step
with discount 0; `truncated` (the time limit, 1000 steps for MuJoCo tasks) gives a LAST
step with discount 1, so learners bootstrap from the value of the final observation.
SEED RL's own MuJoCo wrapper treated time limits as terminations; here they are not.

`random_first_episode` (off by default) truncates an env's first episode at a length
drawn uniformly from 1 .. the time limit, from the env's seed. Envs that are stepped in
lockstep and never terminate (HalfCheetah) otherwise stay at the same step of their
episodes forever, and every unroll of a learner batch covers the same phase; one short
first episode each spreads their phases over the whole episode for the rest of the run
(Isaac Gym's environments randomize their first episode's progress alike). The cut is
a truncation (discount 1): learners bootstrap through it.

Pickling an env saves its state (a reproducible run's round checkpoints,
`seedacme.run.resume`). Gymnasium's `EzPickle` envs (MuJoCo's) pickle by their
constructor arguments, so their unpickled copy would start afresh: for MuJoCo the
simulator's integration state (`mj_getState`, warm start included) and the env's
generator go beside them and are put back on load (Hopper-v5: 2,000 steps after a
round trip, resets included, identical to the original's); for Atari (ale-py) the
emulator's state (`cloneState(include_rng=True)`) and the env's generator, the
wrappers' frame buffers pickling as they are (Pong and Breakout: 300 steps identical);
with sticky actions a copy's frames differed from its first step, so such an env
refuses by name; any other `EzPickle` env refuses to pickle (`TypeError` naming it), so
a resume says it is not exact rather than continuing from a fresh env.
"""

import dm_env
from dm_env import specs
import gymnasium
import numpy as np


class GymnasiumEnv(dm_env.Environment):
  """Wraps a gymnasium env with a `Discrete` or float `Box` action space and a `Box`
  observation space."""

  def __init__(self, env: gymnasium.Env, seed: int | None = None,
               random_first_episode: bool = False):
    space = env.action_space
    self._continuous = isinstance(space, gymnasium.spaces.Box)
    if self._continuous and not np.issubdtype(space.dtype, np.floating):
      raise ValueError(f'Box action spaces must hold floats, got {space}')
    if not (self._continuous or isinstance(space, gymnasium.spaces.Discrete)):
      raise ValueError(f'Only Discrete or Box action spaces are supported, got {space}')
    if not isinstance(env.observation_space, gymnasium.spaces.Box):
      raise ValueError(f'Only Box observation spaces are supported, got {env.observation_space}')
    self._env = env
    self._seed = seed
    self._dtype = (np.float32 if np.issubdtype(env.observation_space.dtype, np.floating)
                   else env.observation_space.dtype)
    self._needs_reset = True
    self._steps_left: int | None = None  # until the first episode's cut, if any
    if random_first_episode:
      limit = env.spec.max_episode_steps if env.spec is not None else None
      if not limit:
        raise ValueError('random_first_episode needs a time limit (max_episode_steps)')
      self._steps_left = int(np.random.default_rng(seed).integers(1, limit + 1))

  def __getstate__(self):
    state = dict(self.__dict__)
    base = self._env.unwrapped
    if isinstance(base, gymnasium.utils.EzPickle):
      saved = _mujoco_state(base) or _ale_state(base)
      if saved is None:
        raise TypeError(f'{type(base).__name__} pickles by its constructor arguments '
                        '(gymnasium EzPickle), not its state')
      state['_base_state'] = saved
    return state

  def __setstate__(self, state):
    state = dict(state)
    saved = state.pop('_base_state', None)
    self.__dict__.update(state)
    if saved is not None:
      (_set_ale_state if 'ale' in saved else _set_mujoco_state)(self._env.unwrapped, saved)

  def reset(self) -> dm_env.TimeStep:
    obs, _ = self._env.reset(seed=self._seed)
    self._seed = None  # Seed only the first episode; later ones follow the RNG.
    self._needs_reset = False
    return dm_env.restart(np.asarray(obs, dtype=self._dtype))

  def step(self, action) -> dm_env.TimeStep:
    if self._needs_reset:
      return self.reset()  # The action for a LAST step is ignored.
    action = self._continuous_action(action) if self._continuous else int(action)
    obs, reward, terminated, truncated, _ = self._env.step(action)
    obs = np.asarray(obs, dtype=self._dtype)
    reward = float(reward)
    if self._steps_left is not None:
      self._steps_left -= 1
      truncated = truncated or self._steps_left == 0
    if terminated or truncated:
      self._needs_reset = True
      self._steps_left = None  # the first episode is over: later ones run whole
    if terminated:
      return dm_env.termination(reward, obs)
    if truncated:
      return dm_env.truncation(reward, obs)
    return dm_env.transition(reward, obs)

  def _continuous_action(self, action) -> np.ndarray:
    space = self._env.action_space
    action = np.asarray(action, dtype=space.dtype)
    ok = action.size == np.prod(space.shape)
    if ok:
      action = action.reshape(space.shape)
      ok = (np.isfinite(action).all() and (action >= space.low).all()
            and (action <= space.high).all())
    if not ok:  # Bad actions never reach the env.
      name = self._env.spec.id if self._env.spec else type(self._env.unwrapped).__name__
      raise ValueError(f'{name}: action {action.tolist()} is not finite, not of shape '
                       f'{space.shape} or outside [{space.low.tolist()}, {space.high.tolist()}]')
    return action

  def observation_spec(self) -> specs.Array:
    return specs.Array(self._env.observation_space.shape, self._dtype, 'observation')

  def action_spec(self) -> specs.DiscreteArray | specs.BoundedArray:
    space = self._env.action_space
    if self._continuous:
      return specs.BoundedArray(space.shape, np.float32, space.low, space.high,
                                name='action')
    return specs.DiscreteArray(int(space.n), np.int32, name='action')

  def close(self) -> None:
    self._env.close()


def make_gymnasium(env_id: str, seed: int, random_first_episode: bool = False,
                   **make_kwargs) -> GymnasiumEnv:
  """`gymnasium.make(env_id, **make_kwargs)` as a dm_env environment."""
  return GymnasiumEnv(gymnasium.make(env_id, **make_kwargs), seed=seed,
                      random_first_episode=random_first_episode)


def _mujoco_state(base):
  """A MuJoCo env's integration state and generator state (None: not a MuJoCo env)."""
  try:
    import mujoco  # pylint: disable=g-import-not-at-top
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  if not isinstance(base, MujocoEnv):
    return None
  spec = mujoco.mjtState.mjSTATE_INTEGRATION
  physics = np.empty(mujoco.mj_stateSize(base.model, spec))
  mujoco.mj_getState(base.model, base.data, physics, spec)
  return {'physics': physics, 'np_random': _generator_state(base)}


def _ale_state(base):
  """An Atari env's emulator state (its own generator included) and the env's generator
  (None: not an ale-py env)."""
  ale = getattr(base, 'ale', None)
  if ale is None or not hasattr(ale, 'cloneState'):
    return None
  sticky = ale.getFloat('repeat_action_probability')
  if sticky > 0:  # seen here: a copy's frames differed from its first step
    raise TypeError(f'{type(base).__name__} with sticky actions '
                    f'(repeat_action_probability={sticky:g}) cannot be saved: ALE 0.12\'s '
                    'saved state does not continue them')
  return {'ale': ale.cloneState(include_rng=True), 'np_random': _generator_state(base)}


def _set_ale_state(base, saved) -> None:
  base.ale.restoreState(saved['ale'])
  _set_generator_state(base, saved['np_random'])


def _generator_state(base):
  """The env's numpy generator's state (None: it has none yet)."""
  generator = getattr(base, '_np_random', None)
  return None if generator is None else generator.bit_generator.state


def _set_generator_state(base, state) -> None:
  if state is not None:
    base.np_random.bit_generator.state = state


def _set_mujoco_state(base, saved) -> None:
  import mujoco  # pylint: disable=g-import-not-at-top
  mujoco.mj_setState(base.model, base.data, saved['physics'],
                     mujoco.mjtState.mjSTATE_INTEGRATION)
  _set_generator_state(base, saved['np_random'])
