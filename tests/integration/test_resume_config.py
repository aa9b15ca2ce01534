"""A resume is the run asked for, or it stops at once: `run_local` on a real logdir.

On 055f757 `run_local catch vtrace 2 --agent_config core=lstm` on a feed-forward run's
logdir resumed it and exited 0. Now a run leaves its checkpoint and saved config, and
the same command with another core is refused by the launcher before anything starts
(~50 s: the first run). With that change allowed by flag, the central node's restore
finds objects that do not match and stops the program as a fatal error, which the
supervisor does not retry (~60 s; the checkpoint made in this process).
"""

import os

import pytest

from seedacme.launchers import local, program_flags
from tests.integration.launch import Run

pytestmark = pytest.mark.integration

COMMAND = ['catch', 'vtrace', '2', '4', '--num_eval_envs', '0', '--progress_interval_s', '1']


@pytest.mark.timeout(180)
def test_a_resume_with_another_network_is_refused_by_the_launcher(tmp_path):
  logdir = str(tmp_path / 'logdir')
  first = Run(COMMAND + ['--max_seconds', '4', '--checkpoint_interval_s', '2'],
              str(tmp_path / 'first'), logdir=logdir)
  first.complete(120)
  assert 'budgets: 4s of run time' in first.output
  assert os.path.exists(os.path.join(logdir, 'checkpoints', 'run_config.json'))

  refused = Run(COMMAND + ['--max_seconds', '4', '--agent_config', 'core=lstm'],
                str(tmp_path / 'refused'), logdir=logdir)
  assert refused.wait(60) == 2, refused.output[-3000:]
  assert "agent_config.core: saved 'feedforward', now 'lstm'" in refused.output
  assert not refused.wait_for_no_leftovers()


@pytest.mark.timeout(180)
def test_a_checkpoint_that_does_not_match_stops_the_program_without_restarts(tmp_path):
  from seedacme.agents.vtrace import learning  # pylint: disable=g-import-not-at-top
  from seedacme.learner.checkpointing import Checkpointer  # pylint: disable=g-import-not-at-top
  from seedacme.run.identity import run_identity  # pylint: disable=g-import-not-at-top
  logdir = str(tmp_path / 'logdir')
  # The checkpoint and config a feed-forward run of this command leaves.
  _, spec, builder, config = program_flags.make_program_inputs(
      local.parse_args(COMMAND + ['--max_seconds', '6']), logdir)
  learner = learning.VTraceLearner(builder.make_networks(spec), builder.config, None)
  Checkpointer(os.path.join(logdir, 'checkpoints'), learner.checkpoint_state(),
               identity=run_identity(builder, spec, config)).save(
                   {'learner_steps': 0, 'env_steps': 0, 'episodes': 0})

  forced = Run(COMMAND + ['--max_seconds', '6', '--agent_config', 'core=lstm',
                          '--allow_config_change', 'agent_config.core'],
               str(tmp_path / 'forced'), logdir=logdir)
  code = forced.wait(120)
  assert not forced.wait_for_no_leftovers()
  assert code != 0, forced.output[-3000:]
  assert 'does not match this program' in forced.output  # the node's event, on the console
  learner_log = forced.node_log('learner/0')
  assert 'CheckpointMismatchError' in learner_log and 'not restarting it' in learner_log
  assert 'restart #1' not in learner_log
