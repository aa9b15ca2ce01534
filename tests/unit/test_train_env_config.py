"""Env options for training envs only (issue 36): PPO's random first episodes on MuJoCo.

The registry gives PPO's MuJoCo training envs `random_first_episode=True`
(`AgentEntry.train_env_defaults`); the program's actors build their envs with it, the
evaluator's never (its returns must be whole episodes), and `--env_config` overrides the
default. Checked on the program the launcher builds: the env factory each actor and
evaluator node is handed, and the envs those factories make.
"""

import dataclasses
import json

import pytest

from seedacme.launchers import local, program_flags
from seedacme.nodes import program as program_lib
from seedacme.types import EnvFactories


def node_factories(argv, tmp_path):
  """{group: [env factory of each node]} of the program `run_local argv` builds, and
  its config."""
  args = local.parse_args([*argv, '--checkpoint_interval_s', '0'])
  factory, spec, builder, config = program_flags.make_program_inputs(args, str(tmp_path))
  program = program_lib.make_program(builder, factory, spec, config, name='t')
  return {group: [node._func_kwargs['env_factory'] for node in nodes]  # pylint: disable=protected-access
          for group, nodes in program.groups.items() if group in ('actor', 'evaluator')
          }, config


def first_episode_length(factory) -> int:
  env = factory(3)
  step, steps = env.reset(), 0
  while not step.last():
    step, steps = env.step(env.action_spec().generate_value()), steps + 1
  env.close()
  return steps


HALFCHEETAH = ['mujoco', 'ppo', '2', '2', '--level', 'HalfCheetah-v5']


def test_ppo_mujoco_actors_get_random_first_episodes_the_evaluator_does_not(tmp_path):
  factories, config = node_factories(HALFCHEETAH, tmp_path)
  assert len(factories['actor']) == 2 and len(factories['evaluator']) == 1
  for factory in factories['actor']:
    assert factory.keywords['random_first_episode'] is True
  evaluation = factories['evaluator'][0]
  assert 'random_first_episode' not in evaluation.keywords  # the env's default: off
  assert evaluation.keywords['level'] == 'HalfCheetah-v5'
  # The envs themselves: a training env's first episode is cut short, the evaluator's
  # runs to the time limit.
  assert first_episode_length(factories['actor'][0]) < 1000
  assert first_episode_length(evaluation) == 1000
  # What the run records as its env (compared on resume): the training envs' options.
  assert config.env_args == {'level': 'HalfCheetah-v5', 'random_first_episode': True}


def test_an_explicit_user_value_wins(tmp_path):
  factories, config = node_factories(
      [*HALFCHEETAH, '--env_config', 'random_first_episode=False'], tmp_path)
  assert [f.keywords['random_first_episode'] for f in factories['actor']] == [False, False]
  assert 'random_first_episode' not in factories['evaluator'][0].keywords
  assert config.env_args['random_first_episode'] is False


def test_a_training_only_option_never_reaches_the_evaluator(tmp_path):
  """V-trace has no such default; a user who asks for random first episodes gets them
  on the training envs, still not on the evaluator's."""
  factories, _ = node_factories(['mujoco', 'vtrace', '1', '2', '--level', 'Hopper-v5',
                                 '--env_config', 'random_first_episode=True'], tmp_path)
  assert factories['actor'][0].keywords['random_first_episode'] is True
  assert 'random_first_episode' not in factories['evaluator'][0].keywords


@pytest.mark.parametrize('argv', [['mujoco', 'sac', '1', '2'], ['cartpole', 'ppo', '1', '2'],
                                  ['atari', 'ppo', '1', '2', '--game', 'Pong']])
def test_other_agents_and_envs_keep_one_factory(argv):
  args = local.parse_args(argv)
  train, evaluation = program_flags.env_options(args)
  assert train == evaluation and 'random_first_episode' not in train
  factory = program_flags.make_program_inputs(args, '/tmp/unused')[0]
  assert not isinstance(factory, EnvFactories)


@pytest.mark.parametrize('argv', [
    HALFCHEETAH, ['catch', 'vtrace', '2', '1', '--agent_config', 'learning_rate=3e-4'],
    ['atari', 'ppo', '2', '16', '--game', 'Pong', '--env_engine', 'vector_sync']])
def test_the_resolved_run_is_what_the_launcher_builds(argv):
  """`resolved_run` (what benchmarks record and the README test compares) is the
  config the launcher builds, the registry's fit to the program's size included."""
  args = local.parse_args(argv)
  resolved = program_flags.resolved_run(args)
  _, _, builder, config = program_flags.make_program_inputs(args, '/tmp/unused')
  assert resolved['agent_config_full'] == json.loads(
      json.dumps(dataclasses.asdict(builder.config)))
  env_config = resolved['env_config_full']
  assert {k: env_config[k] for k in config.env_args} == config.env_args
  if args.env == 'mujoco':
    assert env_config == {'level': 'HalfCheetah-v5', 'max_episode_steps': None,
                          'random_first_episode': True, 'contact_forces': None}
