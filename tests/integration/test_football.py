"""A short real program on Google Research Football: SMM observations, SEED's torso.

gfootball is optional (scripts/setup_football): skipped without it, unless
SEEDACME_REQUIRE_FOOTBALL=1 (CI), where a missing gfootball fails the test.
"""

import os

import pytest

from tests.integration.launch import Run

pytestmark = pytest.mark.integration


def _require_gfootball() -> None:
  try:
    import gfootball.env  # noqa: F401
  except ImportError:
    if os.environ.get('SEEDACME_REQUIRE_FOOTBALL') == '1':
      raise
    pytest.skip('gfootball is not installed (scripts/setup_football)')


@pytest.mark.timeout(150)
def test_vtrace_on_empty_goal_close_runs_end_to_end(tmp_path):
  _require_gfootball()
  # Small unrolls and batches so that the ResNet learner steps within the budget on CPU;
  # stops after 12 learner steps (or 50 s on a busy machine).
  run = Run(['football', 'vtrace', '1', '4', '--scenario', 'academy_empty_goal_close',
             '--num_eval_envs', '2', '--max_seconds', '50', '--max_learner_steps', '12',
             '--progress_interval_s', '2',
             '--checkpoint_interval_s', '0', '--agent_config', 'unroll_length=8',
             '--agent_config', 'batch_size=4'], str(tmp_path))
  run.complete(120)
  summary = run.json('summary.json')
  assert summary['stop']['kind'] in ('learner_steps', 'env_steps', 'time'), summary  # a budget
  assert summary['env_steps'] > 0 and summary['learner_steps'] > 0, summary
  assert summary['episodes'] > 0, summary  # episodes of this scenario are short
  # Scoring reward: +1 for a goal, -1 for one conceded (an own goal counts; CI saw a
  # random policy's -1 in 1 of 7 episodes), and an academy episode ends at the first goal.
  assert -1.0 <= summary['average_return'] <= 1.0, summary
  assert 'final average return' in run.output
  for node in ('actor/0', 'evaluator/0'):
    assert 'tensorflow imported: False' in run.node_log(node), node
  assert 'Traceback' not in run.node_log('learner/0')
  assert os.path.exists(os.path.join(run.logdir, 'curve.csv'))
