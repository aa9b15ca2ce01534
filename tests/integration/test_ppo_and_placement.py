"""Real programs for PPO, continuous control and split device placement.

PPO solves CartPole (greedy evaluator); V-trace learns Catch with inference on one
logical CPU and the learner data-parallel over two others. Continuous actions end to end
(shared memory, the action head, bounds checked on the server) are shown learning in
test_continuous_learning.py (InvertedPendulum), which replaced a 40-s HalfCheetah run
here that only checked the program ran.
"""

import pytest

from tests.integration.launch import Run, target_value

pytestmark = pytest.mark.integration


@pytest.mark.long('learns CartPole to 475 greedy: ~1 min, up to 5 under load')
@pytest.mark.timeout(300)
def test_ppo_solves_cartpole_greedy(tmp_path):
  run = Run(['cartpole', 'ppo', '2', '8', '--max_seconds', '200', '--target_return', '475',
             '--target_on', 'eval'], str(tmp_path))
  run.complete(280)
  summary = run.json('summary.json')
  assert summary['stop']['kind'] == 'eval_target', summary
  assert target_value(summary) >= 475
  assert summary['learner_policy_lag'] >= 0  # the measured lag reaches the summary


@pytest.mark.long('learns Catch to 0.9: ~1 min, up to 7 under load')
@pytest.mark.timeout(420)
def test_catch_learns_with_the_learner_on_two_devices(tmp_path):
  run = Run(['catch', 'vtrace', '2', '16', '--max_seconds', '300', '--target_return', '0.9',
             '--logical_cpus', '3', '--inference_devices', '1', '--learner_devices', '2'],
            str(tmp_path))
  run.complete(400)
  summary = run.json('summary.json')
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary
  assert target_value(summary) >= 0.9
  log = run.node_log('learner/0')
  assert 'inference on /device:CPU:0; learner on /device:CPU:1, /device:CPU:2' in log
