"""`accelerator_check`: one line and exit 1 without an accelerator; with `--allow_cpu`
the whole timing path (every agent's compiled policy step and learner step, placement
checked) runs on the CPU and writes its JSON.

Both in-process (TensorFlow is imported once); the second with the smallest settings.
"""

import glob
import json
import os

import pytest

from seedacme.agents import registry
from seedacme.launchers import accelerator_check


def _accelerator_visible() -> bool:
  return accelerator_check.accelerator(accelerator_check.list_devices()) is not None


def test_without_an_accelerator_it_says_so_in_one_line_and_exits_1(capsys):
  if _accelerator_visible():
    pytest.skip('this machine has a GPU or TPU')
  assert accelerator_check.main([]) == 1
  captured = capsys.readouterr()
  lines = captured.err.splitlines()
  assert len(lines) == 1, captured.err
  assert lines[0].startswith('accelerator_check: no GPU or TPU visible to TensorFlow')
  assert '(devices: CPU:0)' in lines[0] and 'CUDA libraries:' in lines[0]
  assert captured.out == ''


@pytest.mark.long("traces and times every agent's learner step on the CPU: 70-160 s")
@pytest.mark.timeout(300)  # traces every agent's step: ~70 s quiet, 160 s at load 7
def test_allow_cpu_times_every_agent_on_the_cpu_and_writes_json(tmp_path, capsys):
  # Learner batches of 2: what is checked (the path runs, on the device, a finite loss)
  # does not depend on the size, and PPO's Atari batch of 32 x 128 frames was most of
  # the time (two of its steps: ~2/3 of the test).
  code = accelerator_check.main(['--allow_cpu', '--quick', '--batch_sizes', '1',
                                 '--calls', '1', '--learner_steps', '1',
                                 '--learner_batch_size', '2', '--out_dir', str(tmp_path)])
  out = capsys.readouterr().out
  assert code == 0, out
  [path] = glob.glob(os.path.join(str(tmp_path), 'accelerator_check_*.json'))
  with open(path) as f:
    result = json.load(f)
  assert result['errors'] == [] and result['off_device'] == []
  assert result['tensorflow'] and result['machine']['cores'] >= 1
  assert result['devices']['logical']
  agents = set(registry.agent_names())
  continuous_only = {'sac'}  # timed on a continuous (MuJoCo-shaped) spec instead
  expected = {(a, 'mujoco' if a in continuous_only else 'cartpole') for a in agents} | {
      (a, 'atari') for a in accelerator_check.ATARI_AGENTS if a in agents}
  inference = {(r['agent'], r['env']): r for r in result['inference']}
  learner = {(r['agent'], r['env']): r for r in result['learner']}
  assert set(inference) == expected and set(learner) == expected
  for row in result['inference']:
    assert row['batch'] == 1 and row['ms'] > 0 and row['on_device'], row
  assert result['learner_batch_size'] == 2
  for row in result['learner']:
    assert row['batch'] == 2, row
    assert row['ms'] > 0 and row['transitions'] > 0 and row['loss_finite'], row
    assert row['on_device'] and row['variable_devices'], row
  assert 'ms/batch' in out and 'transitions/s' in out
