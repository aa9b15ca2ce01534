"""Placement of inference and learning on devices, tested with the CPU split into logical
devices (the device cases run in a fresh process, one for the module: `placement_cases.py`).

`resolve`'s defaults and refusals against device lists; then, on 4 logical CPUs: the
learner's variables and the batch step land on the devices named; a learner step
mirrored over 2 devices gives the single-device step's variables (V-trace, R2D2, PPO);
inference on its own device keeps serving while the learner steps and its copy of the
parameters is at most one learner step old; `policy_copy` gives inference that copy on
the learner's own device too.
"""

import json
import os
import subprocess
import sys

import pytest

from seedacme.runtime.placement import PlacementError, canonical, resolve

CPU = ['/device:CPU:0']
CPUS = [f'/device:CPU:{i}' for i in range(4)]
GPUS = CPU + [f'/device:GPU:{i}' for i in range(4)]


def _resolve(inference, learner, devices):
  return resolve(inference, learner, list_devices=lambda: devices)


def test_defaults_by_the_accelerators_seen():
  assert _resolve(None, None, CPU).shared  # no accelerator: both on CPU:0, as before
  one = _resolve(None, None, CPU + ['/device:GPU:0'])
  assert one.inference == '/device:GPU:0' and one.learner == ('/device:GPU:0',)
  many = _resolve(None, None, GPUS)
  assert many.inference == '/device:GPU:0'
  assert many.learner == ('/device:GPU:1', '/device:GPU:2', '/device:GPU:3')


def test_counts_and_names():
  p = _resolve('1', '2', CPUS)  # no accelerator: counts take logical CPUs
  assert p.inference == '/device:CPU:0' and p.learner == ('/device:CPU:1', '/device:CPU:2')
  p = _resolve('GPU:3', 'gpu:0,/GPU:1', GPUS)
  assert p.inference == '/device:GPU:3' and p.learner == ('/device:GPU:0', '/device:GPU:1')
  assert canonical('/job:localhost/replica:0/task:0/device:GPU:2') == '/device:GPU:2'


@pytest.mark.parametrize('inference, learner, message', [
    ('GPU:7', None, 'GPU:7 not found; TensorFlow sees: /device:CPU:0, /device:GPU:0'),
    (None, 'GPU:1,GPU:1', 'GPU:1 listed twice'),
    ('2', None, 'serves from one device'),
    (None, '9', '9 devices asked for'),
])
def test_impossible_placements_name_the_devices(inference, learner, message):
  with pytest.raises(PlacementError, match=message):
    _resolve(inference, learner, GPUS)


_CASES = ('devices', 'mirrored_equals_single', 'sync', 'policy_copy')


@pytest.fixture(scope='module')
def cases():
  """What each case of `placement_cases.py` found, all run in one fresh process (each in
  its own took ~10 s more, TensorFlow imported again); the first test waits for it."""
  here = os.path.dirname(os.path.abspath(__file__))
  out = subprocess.run([sys.executable, os.path.join(here, 'placement_cases.py'), *_CASES],
                       capture_output=True, text=True, timeout=280, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def _case(cases, name):
  found = cases[name]
  assert 'error' not in found, found['error']
  return found


@pytest.mark.timeout(300)
def test_variables_and_the_batch_step_land_on_the_devices_named(cases):
  found = _case(cases, 'devices')
  assert [d.split('device:')[-1] for d in found['learner_variable_devices']] == \
      ['CPU:1', 'CPU:2']
  assert found['policy_device'] == '/device:CPU:3' and len(found['actions']) == 4
  assert found['traced_ahead']  # the replicated step traces before the first batch


@pytest.mark.timeout(300)
def test_a_step_mirrored_over_two_devices_equals_the_single_device_step(cases):
  found = _case(cases, 'mirrored_equals_single')
  for agent in ('vtrace', 'r2d2', 'ppo'):
    assert found[agent]['same_start'] == 0.0
    assert found[agent]['moved'] > 1e-5  # the step changed the variables ...
    assert found[agent]['max_diff'] < 1e-6, (agent, found[agent])  # ... the same way
    assert found[agent]['loss'][0] == pytest.approx(found[agent]['loss'][1], rel=1e-5)


@pytest.mark.timeout(300)
def test_inference_on_its_own_device_serves_with_parameters_at_most_one_step_old(cases):
  found = _case(cases, 'sync')
  assert found['served'] == 3 and found['copies'] == 4
  assert all(s > 0 for s in found['stale'])  # one learner step behind before the copy
  assert found['fresh'] == [0.0, 0.0, 0.0]  # equal after it


@pytest.mark.timeout(300)
def test_policy_copy_gives_inference_its_own_variables_on_a_shared_device(cases):
  found = _case(cases, 'policy_copy')
  assert found['shared_same_objects'] and not found['shared_sync']  # the default
  assert found['copy_placement_shared'] and not found['copy_same_objects']
  assert found['after_copy'] == 0.0
  assert found['after_step'] > 0  # a learner step leaves inference's copy as it was ...
  assert found['after_next_copy'] == 0.0  # ... until the copy after it
