"""Adding an agent: a package and one registration line, then the real program runs it.

`tests/integration/random_agent` is a whole agent (config, builder, policy, sink,
learner) registered with one `register_agent` line; nothing in seedacme, the launchers
or the program assembly knows it. Here it runs as `run_local catch random ...`: real
Launchpad nodes, supervised central node, actors and evaluator, to a learner-step
budget, a summary with its typed stop reason, a checkpoint and the exported policy.
"""

import os

import pytest

from tests.integration.launch import Run


@pytest.mark.timeout(240)
def test_a_registered_third_agent_runs_through_the_program(tmp_path):
  run = Run(['catch', 'random', '1', '4', '--max_learner_steps', '40', '--max_seconds',
             '150', '--num_eval_envs', '2', '--progress_interval_s', '1'], str(tmp_path),
            register='tests.integration.random_agent')
  run.complete(timeout=200)
  summary = run.json('summary.json')
  assert summary['stop'] == {'kind': 'learner_steps', 'value': 40, 'threshold': 40}, summary
  assert summary['learner_updates'] >= 40  # the agent's own learner metric
  assert summary['env_steps'] > 0 and summary['trajectory_steps_seen'] > 0
  assert summary['episodes'] > 0 and summary['average_return'] < 0.5  # random on Catch
  assert os.path.isdir(os.path.join(run.logdir, 'saved_model'))
  assert 'seedacme: random on catch:' in run.output
