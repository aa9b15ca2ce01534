"""A seed names a run (issue 63) in the real program: `run_local catch vtrace` and
`run_local mujoco ppo --level Hopper-v5` with `--reproducible`, each launched as 2 x 8 and
as 4 x 4 actors x envs at the same time (each is the other's load, on shared memory and
Courier, with the evaluator beside them), give the same round records, the same
evaluator passes (each played by one named version of the weights:
`seedacme.serving.evaluation`) and the same final weights.

And the figures each command gave when it was recorded (`RECORDED`): a seed names a run
on any x86-64 CPU with AVX2 and FMA (`seedacme.runtime.machine_pins`), so these runs are
learning tests with exact values (Hopper's training average goes from 14.06 in round 1
to exactly 334.635 at 50k env steps). They are asserted on the CPU model they were
recorded on; elsewhere the test warns with both figures. A change that moves them
changes what every seed names: re-record (`RECORDED`'s comment says how) and say why in
docs/history.md.
"""

import hashlib
import json
import warnings

import pytest

from tests.integration.launch import Run

pytestmark = pytest.mark.integration

# What each command gave, recorded on an Intel Xeon with AVX-512 and AMX, pinned to AVX2
# (2026-12-03, commit 01bcd92: `scripts/run_local <env> <agent> 2 8 <the rest>
# --logdir D`, then `sha256sum D/rounds.jsonl D/evals.jsonl` and the summary's
# weights_sha256 and average_return).
RECORDED_CPU = 'Intel(R) Xeon(R) Processor'
RECORDED = {
    'catch': {
        'rounds_sha256': '1c6b640fa2afd74e5a6696a577e2ce9fb97d056f99b8000ad49d0a521ba8f159',
        'evals_sha256': 'b0f2b27046d0e6e8b64943cdc6fc704852a7b6fb659ef22bd6c4edf9ffebb0ac',
        'weights_sha256': 'a01ea6bb2a7a20eeb263f487c8d637456c5984a86a56a3badb42b4f09c71b533',
        'average_return': -0.78,
    },
    'hopper': {
        'rounds_sha256': '2fadded9f91cc1854e85e7d02588c000ad5e1f3d20e7698438cecd72a79f8f8c',
        'evals_sha256': '3b2f6980b688de494361a44570b10364d033e379568eecea7011d14bf314e3c1',
        'weights_sha256': 'a0ef8f2e25528fbfda63f19bf1c5acc0d2979dfd3486d44a43515363c37c0a88',
        'average_return': 334.63476104795933,
    },
}


def _sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def check_recorded(name: str, logdir: str, summary) -> None:
  """The run in `logdir` gave `RECORDED[name]`: asserted on `RECORDED_CPU`, where the
  figures were made (on another CPU, a warning naming both: the README claims every
  x86-64 CPU with AVX2 and FMA, and CI's log then shows whether it holds there)."""
  machine = summary['reproducible_machine']
  got = {'rounds_sha256': _sha256(f'{logdir}/rounds.jsonl'),
         'evals_sha256': _sha256(f'{logdir}/evals.jsonl'),
         'weights_sha256': summary['weights_sha256'],
         'average_return': summary['average_return']}
  recorded = RECORDED[name]
  if machine['cpu'] == RECORDED_CPU and machine['avx2_fma'] and not machine['unpinned']:
    assert got == recorded, (f'{name} no longer gives its recorded run (see RECORDED)',
                             got, recorded)
  else:
    warnings.warn(f'{name}: recorded on {RECORDED_CPU!r}, this is {machine["cpu"]!r} '
                  f'(unpinned: {machine["unpinned"]}); '
                  + ('the same run' if got == recorded else
                     f'another run: {json.dumps(got)} against {json.dumps(recorded)}'),
                  stacklevel=2)


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
  check_recorded('catch', runs[0].logdir, summaries[0])


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
  texts = {}
  for name in ('rounds.jsonl', 'evals.jsonl'):
    pair = []
    for run in runs:
      with open(f'{run.logdir}/{name}') as f:
        pair.append(f.read())
    assert pair[0] == pair[1] and pair[0], name
    texts[name] = pair[0]
  assert summaries[0]['weights_sha256'] == summaries[1]['weights_sha256']
  for summary in summaries:
    assert summary['stop']['kind'] == 'env_steps', summary['stopped_because']
    assert summary['exact_until_round'] is None, summary['not_exact_because']
    assert summary['env_steps'] >= 50_000
  # The same episodes: every training return and evaluator pass, not only the last.
  for key in ('average_return', 'episodes', 'eval_average_return', 'eval_last_pass'):
    assert summaries[0].get(key) == summaries[1].get(key), key
  # It learns: the first round's training average against the last.
  records = [json.loads(line) for line in texts['rounds.jsonl'].splitlines()]
  assert records[1]['average_return'] < 50 < 250 < records[-1]['average_return'], (
      records[1]['average_return'], records[-1]['average_return'])
  check_recorded('hopper', runs[0].logdir, summaries[0])


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
