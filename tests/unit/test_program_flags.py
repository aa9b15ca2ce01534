"""One definition of the program's flags: run_local and the Vertex launcher build the
same program from the same arguments, and a bad flag gets an error naming it; a budget
the user names replaces the launcher's default time budget."""

import dataclasses
import tempfile

import pytest

from seedacme.config import ProgramConfig
from seedacme.launchers import local, program_flags, vertex
from seedacme.run.accounting import ActingLog
from seedacme.run.monitor import RunMonitor, StopKind

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
  # Only the launchers' default time budgets differ, and a named budget replaces them.
  assert config_a == dataclasses.replace(
      config_b, default_max_seconds=config_a.default_max_seconds) and spec_a == spec_b
  assert config_a.time_budget == config_b.time_budget == 50
  assert builder_a.config == builder_b.config
  assert builder_a.config.batch_size == 8 and builder_a.config.replay_checkpoint_interval_s is None
  assert (config_a.num_actors, config_a.envs_per_actor, config_a.target_on) == (3, 8, 'eval')
  assert config_a.checkpoint_interval_s is None and config_a.max_seconds == 50


@pytest.mark.parametrize('agent', ['vtrace', 'r2d2'])
def test_seed_seeds_the_agent_unless_its_config_names_one(agent):
  """`--seed` was the envs' only: every seed ran the agent's RNG (action sampling,
  minibatch order) from 0."""
  def resolved(*extra):
    args = local.parse_args(['catch', agent, '2', *extra])
    _, _, builder, config = program_flags.make_program_inputs(args, 'gs://bucket/run')
    assert program_flags.resolved_run(args)['agent_config_full']['seed'] == builder.config.seed
    return builder.config.seed, config.seed
  assert resolved() == (0, 0)
  assert resolved('--seed', '3') == (3, 3)
  assert resolved('--seed', '3', '--agent_config', 'seed=7') == (7, 3)


def test_ppo_anneals_its_learning_rate_to_the_env_step_budget():
  """With `anneal_to_budget`, `--max_env_steps` sets the learner steps over which the
  learning rate falls to 0 (budget // (batch unrolls x unroll length)), as CleanRL
  anneals over total_timesteps; no budget, a named decay or the switch off: none of it.
  The launcher and `resolved_run` (what the README check and the saved run config see)
  agree."""
  def decay(*extra):
    args = local.parse_args(['catch', 'ppo', '2', '4', *extra])
    _, _, builder, _ = program_flags.make_program_inputs(args, 'gs://bucket/run')
    full = program_flags.resolved_run(args)['agent_config_full']
    assert full['learning_rate_decay_steps'] == builder.config.learning_rate_decay_steps
    return builder.config.learning_rate_decay_steps
  on = ('--agent_config', 'anneal_to_budget=True')
  # Catch's PPO: batches of 16 unrolls of 20 -> 320 env steps a learner step.
  assert decay(*on, '--max_env_steps', '32000') == 100
  assert decay(*on, '--max_env_steps', '32100') == 100  # whole learner steps
  assert decay(*on) == 0  # no budget: a constant rate
  assert decay('--max_env_steps', '32000') == 0  # Catch's default: off
  assert decay(*on, '--agent_config', 'learning_rate_decay_steps=7',
               '--max_env_steps', '32000') == 7  # a named decay wins
  assert decay('--agent_config', 'anneal_to_budget=False',
               '--max_env_steps', '32000') == 0


def test_flags_the_vertex_launcher_lacked_before_are_there():
  args = vertex.parse_args(['atari', 'vtrace', '4', '--env_engine', 'vector_async',
                            '--scenario', 'x', '--agent_config', 'torso=impala_resnet'])
  assert (args.env_engine, args.scenario, args.agent_config) == (
      'vector_async', 'x', ['torso=impala_resnet'])
  assert args.envs_per_actor == 32 and args.default_max_seconds == 24 * 3600.0  # Vertex
  assert args.max_seconds is None  # not named: the default applies only without budgets
  assert args.standby_restarts and not local.parse_args(['catch', 'vtrace', '2']).standby_restarts


@pytest.mark.parametrize('extra, named', [
    (['--agent_config', 'no_such_field=1'], 'no_such_field'),
    (['--env_engine', 'vector_sync'], 'vector_sync'),
    (['--agent_config', 'batch_size'], 'FIELD=VALUE'),
    # A comma is not a separator: the config took the string and the learner failed on it.
    (['--agent_config', 'learning_rate=4e-4,batch_size=8'],
     r"learning_rate='4e-4,batch_size=8': expected float"),
    (['--agent_config', 'batch_size=8.5'], 'batch_size=8.5: expected int'),
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


class _Serving:
  batch_capacity, actor_restarts, requests_refused = 8, 0, 0

  def batch_stats(self, reset=False):
    raise NotImplementedError

  def trajectory_stats(self):
    return {}


def _stop_at(argv, elapsed_s, env_steps, launcher=local):
  """What the run's monitor says at a record of `elapsed_s` seconds and `env_steps`
  (the monitor makes the run's logdir: a temporary one, removed after)."""
  with tempfile.TemporaryDirectory() as logdir:
    config = program_flags.make_program_inputs(launcher.parse_args(argv), logdir)[3]
    monitor = RunMonitor(config, ActingLog(), _Serving())
    return monitor.stop_reason({'elapsed_s': elapsed_s, 'run_elapsed_s': elapsed_s,
                                'env_steps': env_steps}, 0)


def test_a_named_budget_replaces_the_default_time_budget():
  """`--max_env_steps 1000000` stopped after 125 s at 220k env steps ("reached the time
  budget of 120s", run_local's default): every README one-liner with --max_env_steps
  stopped after two minutes."""
  argv = ['catch', 'vtrace', '2', '8', '--max_env_steps', '1000000']
  assert _stop_at(argv, 125.0, 220_000) is None
  assert _stop_at(argv, 9000.0, 1_000_000).kind is StopKind.ENV_STEPS
  assert _stop_at(['catch', 'vtrace', '2', '--max_learner_steps', '50'], 200.0, 0) is None
  assert _stop_at(['catch', 'vtrace', '2', '--max_learner_steps', '50'], 200.0, 0,
                  vertex) is None


def test_the_default_time_budget_applies_only_without_a_budget():
  # `run_local catch vtrace 2`: run_local's default (120 s).
  stop = _stop_at(['catch', 'vtrace', '2'], 125.0, 0)
  assert (stop.kind, stop.threshold) == (StopKind.TIME, 120.0)
  # `scripts/run_local` with no arguments and CI pass --max_seconds 90.
  stop = _stop_at(['catch', 'vtrace', '2', '--max_seconds', '90'], 91.0, 0)
  assert (stop.kind, stop.threshold) == (StopKind.TIME, 90.0)
  # A target is not a budget: the default time budget still ends a run that misses it.
  stop = _stop_at(['catch', 'vtrace', '2', '--target_return', '0.9'], 125.0, 0)
  assert stop.kind is StopKind.TIME
  # Both: whichever comes first.
  argv = ['catch', 'vtrace', '2', '--max_seconds', '300', '--max_env_steps', '1000']
  assert _stop_at(argv, 301.0, 10).kind is StopKind.TIME
  assert _stop_at(argv, 10.0, 1000).kind is StopKind.ENV_STEPS
  # --max_seconds 0: no limit, and no default either.
  assert _stop_at(['catch', 'vtrace', '2', '--max_seconds', '0'], 1e6, 0) is None


def test_the_start_up_line_says_which_budgets_apply():
  def budgets(*extra):
    args = local.parse_args(['catch', 'vtrace', '2', *extra])
    return program_flags.make_program_inputs(args, '/tmp/unused')[3].describe_budgets()
  assert budgets() == 'budgets: 120s of run time (the default)'
  assert budgets('--max_env_steps', '1000000') == 'budgets: 1,000,000 env steps; no time budget'
  assert budgets('--max_seconds', '90', '--target_return', '0.9') == \
      'budgets: 90s of run time; target return 0.9 (train)'
  assert budgets('--max_seconds', '0') == 'no budget (runs until stopped)'
  assert ProgramConfig(max_learner_steps=10, max_seconds=60).describe_budgets() == \
      'budgets: 10 learner steps, 60s of run time'
