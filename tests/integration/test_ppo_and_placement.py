"""Real programs for PPO, continuous control and split device placement.

PPO solves CartPole (greedy evaluator). (V-trace learning Catch with the learner on two
devices is test_program.test_vtrace_solves_catch_and_shuts_down_cleanly.) Continuous actions end to end
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
