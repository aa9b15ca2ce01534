"""Google Research Football (gfootball) as a dm_env environment, as SEED RL uses it.

gfootball is not part of the base install: `scripts/setup_football` builds it for the
venv's Python 3.10 (see the README). Without it, creating an env raises
`FootballUnavailableError` saying so. This module imports gfootball only when an env is
created, and never TensorFlow: actors import it.

Scenarios by name (`academy_empty_goal_close`, `11_vs_11_easy_stochastic`, ...; see
`gfootball/scenarios/`). One controlled player (the active one), 19 actions. Rendering off.

Representations:

* `extracted` (SEED's): the Super Mini Map, 4 planes of 72 x 96 (left team, right team,
  ball, active player; 0 or 255) stacked over the last 4 frames -> uint8 `[72, 96, 16]`.
  (SEED packs the bits for the wire; here the 0/255 bytes are sent as they are.)
* `simple115v2`: the 115 floats of positions, directions, possession and game mode ->
  float32 `[115]` (meant for the 11 vs 11 scenarios, but works on all of them).

Rewards (SEED's `reward_experiment`): `scoring` (+1 for a goal, -1 for a goal conceded)
or `scoring,checkpoints` (plus up to +1 per episode for carrying the ball towards the
opponent's goal). The reward the learner trains on, and so the episode returns
seedacme reports, is this one. The raw score -- goals for minus goals against, without
checkpoint rewards -- is kept apart on the env: `env.episode_score` (the episode so far,
or the one that just ended) and `env.scores` (the last finished episodes). With
`rewards='scoring'` the two are the same.

An episode ends when gfootball says it is done (match time over, or a scenario's end
condition: a goal, the ball out of play, possession lost); like SEED, that is a terminal
step (discount 0).
"""

import collections
import logging
import os
from typing import Any, Deque

import dm_env
from dm_env import specs
import numpy as np

REPRESENTATIONS = ('extracted', 'simple115v2')
REWARDS = ('scoring', 'scoring,checkpoints')
SMM_HEIGHT, SMM_WIDTH, STACKED_FRAMES = 72, 96, 4

FOOTBALL_INSTALL_HELP = (
    'Google Research Football is not installed: the `gfootball` module (2.10.2) is not '
    'importable. It is an optional part of seedacme: run `scripts/setup_football` '
    '(builds its engine for Python 3.10 into .venv; a few minutes the first time, '
    'seconds from its cache afterwards).')


class FootballUnavailableError(ImportError):
  """`gfootball` cannot be imported; the message says how to install it."""


class _DropEpisodeLines(logging.Filter):
  """Drops gfootball's INFO line per finished episode (floods actor logs)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno <= logging.INFO
                and f'{os.sep}gfootball{os.sep}' in record.pathname)


def _import_gfootball() -> Any:
  try:
    import gfootball.env as football_env  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise FootballUnavailableError(FOOTBALL_INSTALL_HELP) from e
  absl_logger = logging.getLogger('absl')
  if not any(isinstance(f, _DropEpisodeLines) for f in absl_logger.filters):
    absl_logger.addFilter(_DropEpisodeLines())
  return football_env


class FootballEnv(dm_env.Environment):
  """One gfootball scenario with one controlled player, as a dm_env environment."""

  # A reproducible run records its envs as not exact from the start (ProgramConfig.
  # env_not_exact). Probed (academy_3_vs_1_with_keeper, simple115v2, 300 fixed steps):
  # the same seed and actions in a fresh process gave one of two episodes (the other
  # in 3 of 12 processes, 2 of them with address randomisation off), and others when a
  # second env shared the process. The engine's state cannot be pickled either
  # (boost.python's ScenarioConfig), so a resume restarts its episodes.
  not_exact_because = ("gfootball's engine does not repeat an episode under a seed "
                       '(seen: one of two episodes per process, same seed and actions)')

  def __init__(self, scenario: str = '11_vs_11_easy_stochastic',
               representation: str = 'extracted', rewards: str = 'scoring',
               seed: int | None = None, score_window: int = 100):
    """Creates the game (0.1-0.3 s).

    Args:
      scenario: gfootball scenario name, e.g. 'academy_empty_goal_close'.
      representation: 'extracted' (stacked SMM, uint8 [72, 96, 16]) or 'simple115v2'
        (float32 [115]).
      rewards: 'scoring' or 'scoring,checkpoints'.
      seed: seeds the engine of every episode (a fresh seed per episode, drawn from
        this one); None: gfootball's own random seeds. A seeded env repeats its
        episodes when it is the only env in its process (the engine keeps
        process-wide state that envs sharing a process perturb).
      score_window: how many finished episodes `scores` keeps.
    """
    if representation not in REPRESENTATIONS:
      raise ValueError(f'Unknown football representation {representation!r}; choose one '
                       f'of {", ".join(REPRESENTATIONS)}')
    if rewards not in REWARDS:
      raise ValueError(f'Unknown football rewards {rewards!r}; choose one of '
                       f'{", ".join(map(repr, REWARDS))}')
    football_env = _import_gfootball()
    self.scenario = scenario
    self.representation = representation
    self.rewards = rewards
    self._env = football_env.create_environment(
        env_name=scenario, representation=representation, rewards=rewards,
        stacked=representation == 'extracted', render=False,
        channel_dimensions=(SMM_WIDTH, SMM_HEIGHT))
    space = self._env.observation_space
    self._dtype = np.uint8 if representation == 'extracted' else np.float32
    self._shape = tuple(space.shape)
    self._num_actions = int(self._env.action_space.n)
    self._rng = np.random.RandomState(seed) if seed is not None else None
    self._needs_reset = True
    self.episode_score = 0.0
    self.scores: Deque[float] = collections.deque(maxlen=score_window)

  def _observation(self, observation) -> np.ndarray:
    return np.asarray(observation, dtype=self._dtype)

  def reset(self) -> dm_env.TimeStep:
    if self._rng is not None:
      # gfootball draws each episode's engine seed from Python's global `random`
      # unless the config names one: name one from this env's own generator.
      self._env.unwrapped._config['game_engine_random_seed'] = int(
          self._rng.randint(2**31 - 1))
    observation = self._env.reset()
    self._needs_reset = False
    self.episode_score = 0.0
    return dm_env.restart(self._observation(observation))

  def step(self, action) -> dm_env.TimeStep:
    if self._needs_reset:
      return self.reset()
    observation, reward, done, info = self._env.step(int(action))
    self.episode_score += float(info.get('score_reward', reward))
    observation = self._observation(observation)
    if done:
      self._needs_reset = True
      self.scores.append(self.episode_score)
      return dm_env.termination(float(reward), observation)
    return dm_env.transition(float(reward), observation)

  def observation_spec(self) -> specs.Array:
    return specs.Array(self._shape, self._dtype, 'observation')

  def action_spec(self) -> specs.DiscreteArray:
    return specs.DiscreteArray(self._num_actions, np.int32, name='action')

  def close(self) -> None:
    self._env.close()


def make_football(seed: int, scenario: str = '11_vs_11_easy_stochastic',
                  representation: str = 'extracted',
                  rewards: str = 'scoring') -> FootballEnv:
  """A gfootball scenario as a dm_env environment (see the module docstring)."""
  return FootballEnv(scenario, representation=representation, rewards=rewards, seed=seed)
