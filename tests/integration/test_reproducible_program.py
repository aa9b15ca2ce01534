"""A seed names a run (issue 63) in the real program: `run_local catch vtrace` and
`run_local mujoco ppo --level Hopper-v5` with `--reproducible`, each launched as 2 x 8 and
as 4 x 4 actors x envs at the same time (each is the other's load, on shared memory and
Courier, with the evaluator beside them), give the same round records, the same
evaluator passes (each played by one named version of the weights:
`seedacme.serving.evaluation`) and the same final weights.
"""

import pytest

from tests.integration.launch import Run

pytestmark = pytest.mark.integration

COMMAND = ['catch', 'vtrace', '--reproducible', '--agent_config', 'batch_size=16',
           '--max_learner_steps', '20', '--seed', '5']


@pytest.mark.long('two programs at once: 58-98 s at load 6-9 (the in-process 2x8/4x4/'
                  '1x16 runs, tests/unit/test_reproducible_runs.py, are in the default tier)')
@pytest.mark.timeout(300)
def test_reproducible_catch_is_the_same_run_on_2x8_and_4x4_side_by_side(tmp_path):
  runs = [Run(COMMAND[:2] + split + COMMAND[2:], str(tmp_path / f'{split[0]}x{split[1]}'))
          for split in (['2', '8'], ['4', '4'])]
  for run in runs:
    run.complete(240)
  rounds, evals, summaries = [], [], []
  for run in runs:
    with open(f'{run.logdir}/rounds.jsonl') as f:
      rounds.append(f.read())
    with open(f'{run.logdir}/evals.jsonl') as f:
      evals.append(f.read())
    summaries.append(run.json('summary.json'))
  assert rounds[0] == rounds[1]
  assert evals[0] == evals[1] and evals[0]
  assert len(rounds[0].splitlines()) == 21  # rounds 0..20: one learner step each
  assert_same_exact_ends(summaries)


HOPPER = ['mujoco', 'ppo', '--level', 'Hopper-v5', '--reproducible', '--seed', '0',
          '--max_env_steps', '50000', '--agent_config', 'learning_rate=4e-4']


@pytest.mark.long('two Hopper programs at once to 50k env steps: 95 s at load 3')
@pytest.mark.timeout(400)
def test_reproducible_hopper_ppo_to_50k_is_the_same_run_on_2x8_and_4x4_side_by_side(tmp_path):
  """MuJoCo: float physics, episodes of every length, reset noise per env, the PPO
  learner's minibatch shuffles and Adam: the README's Hopper command to 50k env steps."""
  runs = [Run(HOPPER[:2] + split + HOPPER[2:], str(tmp_path / f'{split[0]}x{split[1]}'))
          for split in (['2', '8'], ['4', '4'])]
  for run in runs:
    run.complete(360)
  summaries = [run.json('summary.json') for run in runs]
  for name in ('rounds.jsonl', 'evals.jsonl'):
    texts = []
    for run in runs:
      with open(f'{run.logdir}/{name}') as f:
        texts.append(f.read())
    assert texts[0] == texts[1] and texts[0], name
  assert summaries[0]['weights_sha256'] == summaries[1]['weights_sha256']
  for summary in summaries:
    assert summary['stop']['kind'] == 'env_steps', summary['stopped_because']
    assert summary['exact_until_round'] is None, summary['not_exact_because']
    assert summary['env_steps'] >= 50_000
  # The same episodes: every training return and evaluator pass, not only the last.
  for key in ('average_return', 'episodes', 'eval_average_return', 'eval_last_pass'):
    assert summaries[0].get(key) == summaries[1].get(key), key


def assert_same_exact_ends(summaries) -> None:
  """Two runs of `COMMAND` ended alike and exact: one weights hash, stopped at the
  learner budget at round 20, every evaluator pass complete, the last on the final
  weights (test_reproducible_hosts checks its pair with this too)."""
  assert summaries[0]['weights_sha256'] == summaries[1]['weights_sha256']
  for summary in summaries:
    assert summary['stop']['kind'] == 'learner_steps', summary['stopped_because']
    assert summary['exact_until_round'] is None, summary['not_exact_because']
    assert summary['last_round'] == 20
    assert summary['eval_complete'] and summary['eval_exact_until_pass'] is None
    assert summary['eval_last_pass']['learner_steps'] == 20  # the final weights'
