"""A real Atari program whose actors step their envs with ale-py's C++ engine."""

import re

import pytest

from tests.integration.launch import Run

pytestmark = pytest.mark.integration


@pytest.mark.long('an Atari program (conv nets) for a 30 s budget: ~70 s; the engines are unit-tested (test_atari_vector, test_actor_engines)')
@pytest.mark.timeout(300)
def test_vector_async_actors_run_a_program_and_shut_down(tmp_path):
  # Small on purpose: V-trace on frames is the central node's work, the engine's is cheap.
  run = Run(['atari', 'vtrace', '1', '4', '--env_engine', 'vector_async',
             '--num_eval_envs', '2', '--max_seconds', '30', '--progress_interval_s', '3',
             '--checkpoint_interval_s', '0'], str(tmp_path))
  run.complete(240)
  records = run.progress()
  assert records and records[-1]['env_steps'] > 0
  for node, halves in (('actor/0', 2), ('evaluator/0', 1)):
    log = run.node_log(node)
    assert re.search(rf'envs \(ids \d+\.\.\d+\) in batches of {halves},', log), log[-2000:]
    assert 'tensorflow imported: False' in log
    assert 'Traceback' not in log, log[-3000:]
  assert 'Traceback' not in run.node_log('learner/0')
