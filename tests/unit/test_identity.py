"""The run's saved config (`seedacme.run.identity`): what counts as another run.

The compared fields, flattened and named as the refusal names them; budgets, actor
counts and the env engine never count; `--allow_config_change` takes a field's full
or bare name; a config left without a checkpoint does not bind the next run.
"""

import os

import pytest

from seedacme.agents import r2d2, vtrace
from seedacme.config import ProgramConfig
from seedacme.launchers import local, program_flags
from seedacme.run import identity
from seedacme.types import EnvSpec

SPEC = EnvSpec((10, 5), 'float32', 3)


def _identity(agent=None, spec=SPEC, **config):
  builder = vtrace.VTraceBuilder(agent or vtrace.VTraceConfig())
  return identity.run_identity(builder, spec, ProgramConfig(
      **{'env_name': 'catch', 'env_args': {}, **config}))


def test_what_differs_is_named_field_by_field():
  saved = _identity()
  assert identity.differences(saved, _identity()) == []
  diffs = identity.differences(saved, _identity(vtrace.VTraceConfig(
      core='lstm', hidden_sizes=(32,)), env_name='cartpole', env_args={'level': 'x'}, seed=4))
  assert [d[0] for d in diffs] == ['agent_config.core', 'agent_config.hidden_sizes', 'env',
                                   'seed']  # env_args.level: only one side has it
  assert ('agent_config.hidden_sizes', [64, 64], [32]) in diffs
  other_agent = identity.run_identity(r2d2.R2D2Builder(r2d2.R2D2Config()), SPEC,
                                      ProgramConfig(env_name='catch'))
  assert ('agent', 'vtrace', 'r2d2') in identity.differences(saved, other_agent)
  spec = identity.differences(saved, _identity(spec=EnvSpec((4,), 'float32', 2)))
  assert {d[0] for d in spec} == {'env_spec.observation_shape', 'env_spec.num_actions'}


def test_budgets_actors_and_devices_are_not_part_of_the_run():
  saved = _identity()
  assert identity.differences(saved, _identity(
      max_seconds=10, max_env_steps=5, max_learner_steps=3, target_return=1.0,
      num_actors=7, envs_per_actor=3, num_eval_envs=0, checkpoint_interval_s=5,
      inference='actor', logical_cpus=2)) == []


def test_a_program_composed_in_python_compares_the_env_spec_only():
  saved = _identity(env_name=None)
  assert identity.differences(saved, _identity(env_args={'level': 'y'})) == []
  assert identity.differences(saved, _identity(spec=EnvSpec((4,), 'float32', 3)))


def test_allowed_changes_by_full_or_bare_name_and_the_refusal_says_how():
  saved = _identity()
  changed = _identity(vtrace.VTraceConfig(learning_rate=3e-4, entropy_cost=0.0))
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    identity.compare(saved, changed, ['learning_rate'])
  assert 'agent_config.entropy_cost: saved 0.01, now 0.0' in str(raised.value)
  assert 'learning_rate' not in str(raised.value)
  assert '--allow_config_change entropy_cost' in str(raised.value)
  assert len(identity.compare(saved, changed,
                              ['learning_rate', 'agent_config.entropy_cost'])) == 2


def test_the_launcher_refuses_before_anything_starts(tmp_path):
  """`run_local catch vtrace 2 --agent_config core=lstm` on a feed-forward run's logdir
  resumed it (exit code 0); the launcher now stops with the fields (exit code 2)."""
  logdir = str(tmp_path)
  args = local.parse_args(['catch', 'vtrace', '2', '--max_seconds', '30'])
  _, spec, builder, config = program_flags.make_program_inputs(args, logdir)
  checkpoints = os.path.join(logdir, identity.CHECKPOINTS)
  identity.save(checkpoints, identity.run_identity(builder, spec, config), fresh=True)
  # A config without a checkpoint (a run killed before its first one) binds nothing.
  lstm = local.parse_args(['catch', 'vtrace', '2', '--agent_config', 'core=lstm'])
  program_flags.make_program_inputs(lstm, logdir)
  open(os.path.join(checkpoints, 'checkpoint'), 'w').write('model_checkpoint_path: "ckpt-1"\n')
  with pytest.raises(program_flags.ProgramArgsError,
                     match="agent_config.core: saved 'feedforward', now 'lstm'"):
    program_flags.make_program_inputs(lstm, logdir)
  # Other budgets, more actors, another engine: the same run.
  same = local.parse_args(['catch', 'vtrace', '4', '--max_env_steps', '1000'])
  program_flags.make_program_inputs(same, logdir)
  allowed = local.parse_args(['catch', 'vtrace', '2', '--agent_config', 'core=lstm',
                              '--allow_config_change', 'core'])
  assert program_flags.make_program_inputs(allowed, logdir)[3].allow_config_change == ('core',)
