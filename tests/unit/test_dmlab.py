"""DeepMind Lab adapter without DeepMind Lab: the error path, levels, actions, stepping."""


import dm_env
import numpy as np
import pytest

from seedacme.envs import dmlab
from seedacme.launchers import process


def test_missing_module_gives_actionable_error():
  try:
    import deepmind_lab  # noqa: F401
    pytest.skip('deepmind_lab is installed here')
  except ImportError:
    pass
  with pytest.raises(dmlab.DMLabUnavailableError, match='build it from source'):
    dmlab.make_dmlab(0, level='rooms_watermaze')


def test_run_local_reports_missing_dmlab_and_exits(tmp_path):
  result = process.run(['dmlab', 'vtrace', '1', '--level', 'rooms_watermaze'],
                       str(tmp_path / 'run'), timeout_s=120)
  assert result.returncode == 2
  assert "cannot create 'dmlab'" in result.stderr and 'deepmind_lab' in result.stderr


def test_dmlab30_levels_and_paths():
  assert len(dmlab.DMLAB30_LEVELS) == 30 == len(set(dmlab.DMLAB30_LEVELS))
  assert dmlab.level_path('rooms_watermaze') == 'contributed/dmlab30/rooms_watermaze'
  assert dmlab.level_path('seekavoid_arena_01/custom') == 'seekavoid_arena_01/custom'
  with pytest.raises(ValueError, match="Unknown DMLab level 'watermaze'"):
    dmlab.level_path('watermaze')


def test_action_set_is_impalas_nine_actions():
  assert dmlab.ACTION_SET.shape == (9, 7) and dmlab.ACTION_SET.dtype == np.intc
  assert len(set(map(tuple, dmlab.ACTION_SET))) == 9
  forward = dmlab.ACTION_NAMES.index('forward')
  np.testing.assert_array_equal(dmlab.action_vector(forward), [0, 0, 0, 1, 0, 0, 0])
  look_left_forward = dmlab.ACTION_NAMES.index('look_left_forward')
  np.testing.assert_array_equal(dmlab.action_vector(look_left_forward), [-20, 0, 0, 1, 0, 0, 0])
  with pytest.raises(ValueError, match=r'in \[0, 9\)'):
    dmlab.action_vector(9)


class _RecordingLab:
  """Stands in for deepmind_lab.Lab: a level that ends after 3 steps, reward = step."""

  def __init__(self, level, observations, config):
    self.level, self.observation_names, self.config = level, observations, config
    self.calls = []
    self.t = 0

  def reset(self, seed):
    self.calls.append(('reset', seed))
    self.t = 0

  def step(self, action, num_steps):
    self.calls.append(('step', tuple(action), num_steps))
    self.t += 1
    return float(self.t)

  def is_running(self):
    return self.t < 3

  def observations(self):
    h, w = int(self.config['height']), int(self.config['width'])
    return {'RGB_INTERLEAVED': np.full((h, w, 3), self.t, np.uint8)}

  def close(self):
    pass


def test_adapter_maps_actions_repeats_and_ends_episodes():
  labs = []
  env = dmlab.DMLabEnv('rooms_watermaze', seed=3, width=8, height=6, action_repeat=4,
                       lab_factory=lambda *a, **k: labs.append(_RecordingLab(*a, **k)) or labs[-1])
  lab = labs[0]
  assert lab.level == 'contributed/dmlab30/rooms_watermaze'
  assert lab.observation_names == ['RGB_INTERLEAVED']
  assert env.observation_spec().shape == (6, 8, 3) and env.action_spec().num_values == 9
  assert env.reset().first()
  steps = [env.step(a) for a in (0, 8, 4)]
  assert [s.step_type for s in steps] == [dm_env.StepType.MID, dm_env.StepType.MID,
                                          dm_env.StepType.LAST]
  assert [s.reward for s in steps] == [1.0, 2.0, 3.0] and steps[-1].discount == 0.0
  assert steps[-1].observation.shape == (6, 8, 3) and steps[-1].observation.dtype == np.uint8
  assert [c[1] for c in lab.calls[1:]] == [tuple(dmlab.ACTION_SET[a]) for a in (0, 8, 4)]
  assert all(c[2] == 4 for c in lab.calls[1:])
  assert env.step(0).first()  # after LAST the next step restarts the level
