"""One definition of the program's flags: run_local and the Vertex launcher build the
same program from the same arguments, and a bad flag gets an error naming it."""

import pytest

from seedacme.launchers import local, program_flags, vertex

ARGV = ['catch', 'r2d2', '3', '8', '--max_seconds', '50', '--target_return', '0.9',
        '--target_on', 'eval', '--agent_config', 'batch_size=8', '--agent_config',
        'replay_checkpoint_interval_s=None', '--num_eval_envs', '2', '--seed', '5',
        '--checkpoint_interval_s', '0', '--no-standby_restarts']


def test_both_launchers_build_the_same_program_from_the_same_flags():
  built = []
  for launcher in (local, vertex):
    args = launcher.parse_args(ARGV)
    built.append(program_flags.make_program_inputs(args, 'gs://bucket/run'))
  (_, spec_a, builder_a, config_a), (_, spec_b, builder_b, config_b) = built
  assert config_a == config_b and spec_a == spec_b
  assert builder_a.config == builder_b.config
  assert builder_a.config.batch_size == 8 and builder_a.config.replay_checkpoint_interval_s is None
  assert (config_a.num_actors, config_a.envs_per_actor, config_a.target_on) == (3, 8, 'eval')
  assert config_a.checkpoint_interval_s is None and config_a.max_seconds == 50


def test_flags_the_vertex_launcher_lacked_before_are_there():
  args = vertex.parse_args(['atari', 'vtrace', '4', '--env_engine', 'vector_async',
                            '--scenario', 'x', '--agent_config', 'torso=impala_resnet'])
  assert (args.env_engine, args.scenario, args.agent_config) == (
      'vector_async', 'x', ['torso=impala_resnet'])
  assert args.envs_per_actor == 32 and args.max_seconds == 24 * 3600.0  # Vertex defaults
  assert args.standby_restarts and not local.parse_args(['catch', 'vtrace', '2']).standby_restarts


@pytest.mark.parametrize('extra, named', [
    (['--agent_config', 'no_such_field=1'], 'no_such_field'),
    (['--env_engine', 'vector_sync'], 'vector_sync'),
    (['--agent_config', 'batch_size'], 'FIELD=VALUE'),
])
def test_a_bad_flag_is_named(extra, named):
  args = local.parse_args(['catch', 'vtrace', '2', *extra])
  with pytest.raises(program_flags.ProgramArgsError, match=named):
    program_flags.make_program_inputs(args, '/tmp/unused')


def test_batching_and_transport_flags_reach_the_config():
  """`--inference_batch_envs 0` means ProgramConfig's default (the policy runs whatever
  is queued), not lockstep: run_local had passed None, i.e. lockstep, for every run."""
  def config_of(*extra):
    args = local.parse_args(['catch', 'vtrace', '2', '4', *extra])
    return program_flags.make_program_inputs(args, '/tmp/unused')[3]
  default = config_of()
  assert default.inference_batch_envs == 1 and default.transport == 'auto'
  lockstep = config_of('--inference_batch_envs', '8', '--transport', 'courier')
  assert lockstep.inference_batch_envs == 8 and lockstep.transport == 'courier'
