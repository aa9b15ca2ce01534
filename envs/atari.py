"""Atari 2600 games through ale-py (ROMs ship in the wheel) with the standard
preprocessing of the IMPALA/R2D2/SEED papers:

* 84 x 84 grayscale frames, action repeat 4 with a max over the last two frames,
* a stack of the last 4 frames -> observations `[84, 84, 4]` uint8,
* up to 30 no-op actions at the start of an episode,
* sticky actions off by default (`repeat_action_probability`, 0.25 in ALE v5),
* episodes cut at 108,000 frames (30 minutes of play), as a time-limit truncation,
* no terminal on life loss, and RAW rewards: clipping belongs to the learner's loss,
  so reported returns are game scores.

Any game by name: `make_atari(seed, game='Breakout')`.
"""

import dm_env
import gymnasium
import numpy as np

from seedacme.envs.gym_adapter import GymnasiumEnv

MAX_EPISODE_FRAMES = 108_000


def _register() -> None:
  import ale_py  # pylint: disable=g-import-not-at-top
  gymnasium.register_envs(ale_py)


class _StackLast(gymnasium.ObservationWrapper):
  """FrameStackObservation's `[4, 84, 84]` as `[84, 84, 4]` (channels last)."""

  def __init__(self, env):
    super().__init__(env)
    low = np.moveaxis(env.observation_space.low, 0, -1)
    high = np.moveaxis(env.observation_space.high, 0, -1)
    self.observation_space = gymnasium.spaces.Box(low, high, dtype=np.uint8)

  def observation(self, observation):
    return np.moveaxis(np.asarray(observation), 0, -1)


def make_atari_gymnasium(game: str = 'Pong', noop_max: int = 30, frame_skip: int = 4,
                         frame_stack: int = 4, repeat_action_probability: float = 0.0,
                         full_action_space: bool = False) -> gymnasium.Env:
  _register()
  env = gymnasium.make(f'ALE/{game}-v5', frameskip=1,
                       repeat_action_probability=repeat_action_probability,
                       full_action_space=full_action_space,
                       max_num_frames_per_episode=MAX_EPISODE_FRAMES)
  env = gymnasium.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip,
                                              screen_size=84, terminal_on_life_loss=False,
                                              grayscale_obs=True, scale_obs=False)
  env = gymnasium.wrappers.FrameStackObservation(env, frame_stack)
  return _StackLast(env)


def make_atari(seed: int, game: str = 'Pong', **kwargs) -> dm_env.Environment:
  """An Atari game as a dm_env environment (uint8 `[84, 84, 4]`, raw rewards)."""
  return GymnasiumEnv(make_atari_gymnasium(game, **kwargs), seed=seed)
