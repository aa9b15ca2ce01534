"""DeepMind Lab (DMLab-30) as a dm_env environment, as SEED RL and IMPALA use it.

DeepMind Lab is not on the package index for Python 3.10: the `deepmind_lab` module has
to be built from source by the user (Bazel; see DMLAB_INSTALL_HELP). Without it,
creating an env raises `DMLabUnavailableError` with those instructions; the level names
and the action set below need no DMLab and are tested without it.

Observations: RGB frames `[height, width, 3]` uint8 (72 x 96 by default, as in SEED).
Actions: IMPALA's 9-action set over DMLab's 7-dimensional action vector, each repeated
`action_repeat` (4) frames. An episode ends when the level stops running.
"""

from typing import Any, Callable, Dict, Sequence

import dm_env
from dm_env import specs
import numpy as np

DMLAB_INSTALL_HELP = (
    'DeepMind Lab is not installed: the `deepmind_lab` Python module is not importable. '
    'It is not on PyPI for Python 3.10; build it from source and install it into this '
    'project\'s venv: git clone https://github.com/deepmind/lab && cd lab && follow '
    'docs/users/build.md (bazel build -c opt //python/pip_package:build_pip_package, '
    'then ./bazel-bin/python/pip_package/build_pip_package /tmp/dmlab_pkg), and '
    '`.venv/bin/pip install /tmp/dmlab_pkg/deepmind_lab-*.whl`. Check with '
    '`.venv/bin/python -c "import deepmind_lab"`.')

# The 30 levels of DMLab-30 (level script: contributed/dmlab30/<name>).
DMLAB30_LEVELS = (
    'rooms_collect_good_objects_train', 'rooms_exploit_deferred_effects_train',
    'rooms_select_nonmatching_object', 'rooms_watermaze', 'rooms_keys_doors_puzzle',
    'language_select_described_object', 'language_select_located_object',
    'language_execute_random_task', 'language_answer_quantitative_question',
    'lasertag_one_opponent_small', 'lasertag_three_opponents_small',
    'lasertag_one_opponent_large', 'lasertag_three_opponents_large',
    'natlab_fixed_large_map', 'natlab_varying_map_regrowth', 'natlab_varying_map_randomized',
    'skymaze_irreversible_path_hard', 'skymaze_irreversible_path_varied',
    'psychlab_arbitrary_visuomotor_mapping', 'psychlab_continuous_recognition',
    'psychlab_sequential_comparison', 'psychlab_visual_search',
    'explore_object_locations_small', 'explore_object_locations_large',
    'explore_obstructed_goals_small', 'explore_obstructed_goals_large',
    'explore_goal_locations_small', 'explore_goal_locations_large',
    'explore_object_rewards_few', 'explore_object_rewards_many',
)

# IMPALA's action set. DMLab's action vector is
# (LOOK_LEFT_RIGHT_PIXELS_PER_FRAME, LOOK_DOWN_UP_PIXELS_PER_FRAME, STRAFE_LEFT_RIGHT,
#  MOVE_BACK_FORWARD, FIRE, JUMP, CROUCH).
ACTION_NAMES = ('forward', 'backward', 'strafe_left', 'strafe_right', 'look_left',
                'look_right', 'look_left_forward', 'look_right_forward', 'fire')
ACTION_SET = np.array([
    (0, 0, 0, 1, 0, 0, 0),
    (0, 0, 0, -1, 0, 0, 0),
    (0, 0, -1, 0, 0, 0, 0),
    (0, 0, 1, 0, 0, 0, 0),
    (-20, 0, 0, 0, 0, 0, 0),
    (20, 0, 0, 0, 0, 0, 0),
    (-20, 0, 0, 1, 0, 0, 0),
    (20, 0, 0, 1, 0, 0, 0),
    (0, 0, 0, 0, 1, 0, 0),
], dtype=np.intc)

OBSERVATION = 'RGB_INTERLEAVED'


class DMLabUnavailableError(ImportError):
  """`deepmind_lab` cannot be imported; the message says how to build it."""


def level_path(level: str) -> str:
  """Level script of a DMLab-30 name (other names are passed through as paths)."""
  if level in DMLAB30_LEVELS:
    return f'contributed/dmlab30/{level}'
  if '/' in level:
    return level
  raise ValueError(f'Unknown DMLab level {level!r}: use one of the DMLab-30 names '
                   f'({", ".join(DMLAB30_LEVELS[:3])}, ...) or a level script path')


def action_vector(action: int) -> np.ndarray:
  """DMLab's 7-dim action vector for an index of the 9-action set."""
  if not 0 <= int(action) < len(ACTION_SET):
    raise ValueError(f'DMLab action must be in [0, {len(ACTION_SET)}), got {action}')
  return ACTION_SET[int(action)]


def _import_lab() -> Callable[..., Any]:
  try:
    import deepmind_lab  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DMLabUnavailableError(DMLAB_INSTALL_HELP) from e
  return deepmind_lab.Lab


class DMLabEnv(dm_env.Environment):
  """One DMLab level as a dm_env environment with IMPALA's action set."""

  # Not checked: DeepMind Lab cannot be installed here (its engine may well repeat a
  # seeded episode; nothing here has seen it). A reproducible run says so.
  not_exact_because = ('DeepMind Lab is not checked for exact episodes under a seed '
                       '(not installable where seedacme is tested)')

  def __init__(self, level: str, seed: int, width: int = 96, height: int = 72,
               action_repeat: int = 4, extra_config: Dict[str, str] | None = None,
               lab_factory: Callable[..., Any] | None = None):
    config = {'width': str(width), 'height': str(height), 'logLevel': 'WARN',
              **(extra_config or {})}
    lab_factory = lab_factory or _import_lab()
    self._lab = lab_factory(level_path(level), [OBSERVATION], config=config)
    self._shape = (height, width, 3)
    self._action_repeat = action_repeat
    self._rng = np.random.RandomState(seed)
    self._needs_reset = True
    self._last_observation = np.zeros(self._shape, np.uint8)

  def _observation(self) -> np.ndarray:
    self._last_observation = np.asarray(self._lab.observations()[OBSERVATION], np.uint8)
    return self._last_observation

  def reset(self) -> dm_env.TimeStep:
    self._lab.reset(seed=int(self._rng.randint(0, 2**31 - 1)))
    self._needs_reset = False
    return dm_env.restart(self._observation())

  def step(self, action) -> dm_env.TimeStep:
    if self._needs_reset:
      return self.reset()
    reward = float(self._lab.step(action_vector(action), num_steps=self._action_repeat))
    if not self._lab.is_running():
      self._needs_reset = True
      # The level ended; DMLab gives no final frame, so the last one stands in.
      return dm_env.termination(reward, self._last_observation)
    return dm_env.transition(reward, self._observation())

  def observation_spec(self) -> specs.Array:
    return specs.Array(self._shape, np.uint8, OBSERVATION)

  def action_spec(self) -> specs.DiscreteArray:
    return specs.DiscreteArray(len(ACTION_SET), np.int32, name='action')

  def close(self) -> None:
    self._lab.close()


def make_dmlab(seed: int, level: str = 'explore_goal_locations_small',
               **kwargs: Sequence[Any]) -> DMLabEnv:
  """A DMLab env; raises DMLabUnavailableError when `deepmind_lab` is missing."""
  return DMLabEnv(level, seed, **kwargs)
