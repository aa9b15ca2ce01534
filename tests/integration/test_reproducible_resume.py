"""A killed reproducible run resumes exactly (issue 63 Deliver 3) in the real program:
`run_local catch vtrace --reproducible` with round checkpoints every 5 rounds runs
uninterrupted beside the same command, which is SIGKILLed (every process of it) past
round 12 and started again on its logdir. The resumed run continues at its last round
checkpoint (round 10) and ends with the uninterrupted run's round records, evaluator
passes and final weights (the evaluator continues from its state and envs at its own
call of round 10's first call number, saved beside the round checkpoint).
"""

import os
import time

import pytest

from tests.integration.launch import Run

pytestmark = pytest.mark.integration

COMMAND = ['catch', 'vtrace', '2', '8', '--reproducible', '--agent_config',
           'batch_size=16', '--max_learner_steps', '24', '--seed', '5',
           '--checkpoint_rounds', '5']


def _records(logdir):
  with open(os.path.join(logdir, 'rounds.jsonl')) as f:
    return f.read().splitlines()


@pytest.mark.long('two programs at once, one killed and started again: ~100 s at load 5 '
                  '(the in-process kill and resume, tests/unit/test_exact_resume.py, '
                  'is in the default tier)')
@pytest.mark.timeout(420)
def test_a_killed_reproducible_run_resumes_as_the_uninterrupted_run(tmp_path):
  whole = Run(COMMAND, str(tmp_path / 'whole'))
  killed_logdir = str(tmp_path / 'killed' / 'logdir')
  with Run(COMMAND, str(tmp_path / 'killed'), logdir=killed_logdir) as killed:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
      if os.path.exists(os.path.join(killed_logdir, 'rounds.jsonl')) and \
          len(_records(killed_logdir)) >= 13 and os.path.exists(os.path.join(
              killed_logdir, 'checkpoints', 'rounds', 'eval-10.pkl')):
        break  # round 12 started, and the evaluator has passed round 10's call
      assert killed.proc.poll() is None, killed.output[-3000:]
      time.sleep(0.2)
    killed.kill()  # SIGKILL to every process of the program
  assert len(_records(killed_logdir)) < 25  # it did not finish
  resumed = Run(COMMAND, str(tmp_path / 'resumed'), logdir=killed_logdir)
  resumed.complete(240)
  whole.complete(240)
  assert any('resumed at round 10' in e for e in resumed.events()), resumed.events()
  assert _records(killed_logdir) == _records(whole.logdir)
  assert len(_records(whole.logdir)) == 25
  a, b = whole.json('summary.json'), resumed.json('summary.json')
  assert b['weights_sha256'] == a['weights_sha256']
  assert b['stop']['kind'] == 'learner_steps', b['stopped_because']
  assert a['exact_until_round'] is None and b['exact_until_round'] is None, \
      b['not_exact_because']
  assert b['eval_exact_until_pass'] is None, b['eval_not_exact_because']
  assert b['eval_complete'] and a['eval_complete']
  with open(os.path.join(killed_logdir, 'evals.jsonl')) as f, \
      open(os.path.join(whole.logdir, 'evals.jsonl')) as g:
    assert f.read() == g.read()
