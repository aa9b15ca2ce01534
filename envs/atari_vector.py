"""K Atari games stepped by ale-py's C++ vector engine (`ale_py.AtariVectorEnv`).

The EnvPool idea: the emulators, frame skip, max-pooling, resizing and frame stacking
run in C++ worker threads that release the GIL, so an actor spends its Python time on
one call per batch instead of K `env.step` calls. Two engines, both producing exactly
what `seedacme.actor.engines.BatchedEnv` over `envs/atari.py` envs produces:

* `AtariVectorEnv` (sync): the `BatchedEnv` interface -- `reset()`, `step(actions)` for
  all K envs at once.
* `AtariVectorHalves` (async): ale-py's `batch_size = K/2` mode. `recv()` returns the
  next half batch that is ready (any K/2 env slots, named in `SlotStep.slots`) and
  `send(actions)` gives those envs their actions. While the actor waits for the
  server's answer for one half, the worker threads step the other half.

Semantics (same as `BatchedEnv`): an env whose episode ended returns LAST, and on its
next step FIRST (a new episode; the action sent with the LAST step is ignored). This is
ale-py's `autoreset_mode='NextStep'`: the C++ env resets on the step after the one that
ended the episode and reports reward 0. `SameStep` mode resets within the ending step
(final observation aside) and would step the new episode with the next action instead of
ignoring it, so it cannot give the LAST -> FIRST timeline.

Preprocessing is the one of `envs/atari.py`: 84 x 84 grayscale (`cv::INTER_AREA` in
both), action repeat 4 with a max over the last two frames, stacks of 4 frames as uint8
`[K, 84, 84, 4]` (channels last), no terminal on life loss, no FIRE at reset, raw
(unclipped) rewards, sticky actions off unless `repeat_action_probability` is set.
With `noop_max=0` and no sticky actions, observations, rewards and step types are
bit-identical to `BatchedEnv` over `envs/atari.py` for the same actions
(tests/unit/test_atari_vector.py). Known differences:

* frame stack at an episode start: ale-py pads with zero frames, gymnasium's
  `FrameStackObservation` with copies of the first frame. This module copies the first
  frame into the zero slots (only during an episode's first 3 steps), so they agree.
* no-op starts: ale-py draws 0..noop_max-1 no-ops from its own RNG, gymnasium
  1..noop_max from numpy's; same seed, different episodes (same distribution but for
  the off-by-one).
* the 108,000-frame limit: ale-py counts frames after the no-ops, ALE's
  `max_num_frames_per_episode` (envs/atari.py) counts them too, so an episode that
  runs into the limit may last up to noop_max frames (< 8 agent steps) longer here.
"""

import re
from typing import Any

import numpy as np

from seedacme.envs.atari import MAX_EPISODE_FRAMES
from seedacme.types import FIRST, LAST, MID, BatchStep, EnvSpec, SlotStep


def rom_name(game: str) -> str:
  """ale-py's ROM name of a game: 'MsPacman' -> 'ms_pacman' ('pong' stays 'pong')."""
  return re.sub(r'(?<=[a-z0-9])(?=[A-Z])', '_', game).lower()


class _Timelines:
  """Turns the C++ engine's raw outputs into dm_env-style batches, per env slot.

  Keeps, per env: whether its last timestep ended an episode (so the next one is FIRST)
  and the steps since the episode started (to replace ale-py's zero padding of the
  frame stack by copies of the first frame). Returns are added up by the reader
  (`seedacme.run.accounting.EpisodeTracker`).
  """

  def __init__(self, num_envs: int, stack: int):
    self._stack = stack
    self._ended = np.ones(num_envs, bool)  # before the first reset: next is FIRST
    self._episode_step = np.zeros(num_envs, np.int64)

  def convert(self, slots: np.ndarray, obs: np.ndarray, reward: np.ndarray,
              terminated: np.ndarray, truncated: np.ndarray) -> SlotStep:
    first = self._ended[slots]
    ended = (terminated | truncated) & ~first
    step_type = np.where(first, FIRST, np.where(ended, LAST, MID)).astype(np.int8)
    reward = np.where(first, 0.0, reward).astype(np.float32)
    discount = np.where(terminated & ~first, 0.0, 1.0).astype(np.float32)

    self._episode_step[slots] = np.where(first, 0, self._episode_step[slots] + 1)
    self._ended[slots] = ended

    # [B, stack, H, W] -> [B, H, W, stack], then the first frame over the zero padding.
    observation = np.ascontiguousarray(np.moveaxis(obs, 1, -1))
    for j in np.flatnonzero(self._episode_step[slots] < self._stack - 1):
      newest_pad = self._stack - 1 - int(self._episode_step[slots[j]])
      observation[j, :, :, :newest_pad] = observation[j, :, :, newest_pad:newest_pad + 1]
    return SlotStep(slots, BatchStep(observation, reward, discount, step_type))


class _VectorBase:
  """The ale-py engine, its spec, and action checks shared by both modes."""

  def __init__(self, game: str, num_envs: int, seed: int, batch_size: int,
               num_threads: int = 0, noop_max: int = 30, frame_skip: int = 4,
               frame_stack: int = 4, repeat_action_probability: float = 0.0,
               full_action_space: bool = False,
               max_episode_frames: int = MAX_EPISODE_FRAMES):
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    import ale_py  # pylint: disable=g-import-not-at-top
    self._env = ale_py.AtariVectorEnv(
        rom_name(game), num_envs, batch_size=batch_size, num_threads=num_threads,
        max_num_frames_per_episode=max_episode_frames,
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space, autoreset_mode='NextStep',
        img_height=84, img_width=84, grayscale=True, stack_num=frame_stack,
        frameskip=frame_skip, maxpool=True, noop_max=noop_max, episodic_life=False,
        life_loss_info=False, reward_clipping=False, use_fire_reset=False)
    self.num_envs = num_envs
    self.batch_size = self._env.batch_size
    self.spec = EnvSpec((84, 84, frame_stack), 'uint8',
                        int(self._env.single_action_space.n))
    self._seeds = np.arange(seed, seed + num_envs, dtype=np.int64)  # env i: seed + i
    self._timelines = _Timelines(num_envs, frame_stack)

  def _check_actions(self, actions: Any, count: int) -> np.ndarray:
    actions = np.asarray(actions)
    if actions.shape != (count,):
      raise ValueError(f'expected {count} actions, got an array of shape {actions.shape}')
    actions = actions.astype(np.int32, copy=False)
    if actions.size and (actions.min() < 0 or actions.max() >= self.spec.num_actions):
      raise ValueError(f'actions must be in [0, {self.spec.num_actions}), got '
                       f'{actions.tolist()}')
    return actions

  def _convert(self, result) -> SlotStep:
    obs, reward, terminated, truncated, info = result
    slots = np.asarray(info['env_id'], np.int64)
    return self._timelines.convert(slots, obs, reward, terminated, truncated)

  def close(self) -> None:
    """Stops the worker threads (the C++ engine is destroyed with its last reference)."""
    if self._env is not None:
      self._env.close()
      self._env = None


class AtariVectorEnv(_VectorBase):
  """K Atari envs stepped all at once in C++: `BatchedEnv`'s interface and semantics."""

  def __init__(self, game: str, num_envs: int, seed: int = 0, **kwargs):
    """See `make_vector_engine` for the arguments."""
    super().__init__(game, num_envs, seed, batch_size=num_envs, **kwargs)

  def reset(self) -> BatchStep:
    """Starts a new episode in every env (env i seeded with seed + i on the first reset)."""
    seeds, self._seeds = self._seeds, None  # later resets follow each env's RNG
    self._timelines = _Timelines(self.num_envs, self.spec.observation_shape[-1])
    obs, info = self._env.reset(seed=seeds)
    zeros = np.zeros(self.num_envs, bool)
    return self._timelines.convert(np.asarray(info['env_id'], np.int64), obs,
                                   np.zeros(self.num_envs, np.int32), zeros, zeros).step

  def step(self, actions: np.ndarray) -> BatchStep:
    """Applies `actions[i]` to env i (or restarts it if its episode has ended)."""
    self._env.send(self._check_actions(actions, self.num_envs))
    out = self._convert(self._env.recv())
    # Synchronous mode returns the envs in order (ale-py stages env i in slot i).
    assert np.array_equal(out.slots, np.arange(self.num_envs)), out.slots
    return out.step


class AtariVectorHalves(_VectorBase):
  """K Atari envs served as two half batches: `recv()` the ready half, `send()` its actions.

  Use it as `batch = recv(); loop: actions = policy(batch); send(actions); batch = recv()`.
  The first `recv()` resets every env and returns the first half that is ready. Every
  `send` must follow a `recv` (ale-py applies the actions to the envs of the last
  `recv`); each env appears in at most one of the batches not yet answered, and each
  env's own timesteps arrive in order. Which envs form a half is decided by the C++
  engine (whichever finish first), so the actor reads `slots` every time.
  """

  def __init__(self, game: str, num_envs: int, seed: int = 0, **kwargs):
    """See `make_vector_engine` for the arguments (batch size: max(1, K // 2))."""
    super().__init__(game, num_envs, seed, batch_size=max(1, num_envs // 2), **kwargs)
    self._awaiting_actions = False

  def recv(self) -> SlotStep:
    """The next half batch whose steps are done (the first call resets every env)."""
    if self._awaiting_actions:
      raise RuntimeError('recv() called twice without send(): the envs of the last '
                         'recv() are waiting for their actions')
    if self._seeds is not None:
      seeds, self._seeds = self._seeds, None
      obs, info = self._env.reset(seed=seeds)
      zeros = np.zeros(len(obs), bool)
      out = self._timelines.convert(np.asarray(info['env_id'], np.int64), obs,
                                    np.zeros(len(obs), np.int32), zeros, zeros)
    else:
      out = self._convert(self._env.recv())
    self._awaiting_actions = True
    return out

  def send(self, actions: np.ndarray) -> None:
    """Gives the envs of the last `recv()` their actions (in that batch's order)."""
    if not self._awaiting_actions:
      raise RuntimeError('send() without a recv() whose envs are waiting for actions')
    self._env.send(self._check_actions(actions, self.batch_size))
    self._awaiting_actions = False


def make_vector_engine(engine: str, game: str, num_envs: int, seed: int = 0,
                       **kwargs) -> 'AtariVectorEnv | AtariVectorHalves':
  """A C++ engine for K envs of `game`.

  Args:
    engine: 'vector_sync' (`AtariVectorEnv`) or 'vector_async' (`AtariVectorHalves`).
    game: game name as in envs/atari.py ('Pong', 'MsPacman') or ale-py's ROM name.
    num_envs: K.
    seed: env i is seeded with seed + i.
    **kwargs: num_threads (0: one per core, at most the batch size), noop_max,
      frame_skip, frame_stack, repeat_action_probability, full_action_space,
      max_episode_frames.
  """
  if engine == 'vector_sync':
    return AtariVectorEnv(game, num_envs, seed, **kwargs)
  if engine == 'vector_async':
    return AtariVectorHalves(game, num_envs, seed, **kwargs)
  raise ValueError(f'unknown vector engine {engine!r}; known: vector_sync, vector_async')

