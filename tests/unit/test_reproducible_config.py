"""`--reproducible` (`ProgramConfig.reproducible`, issue 63): what it accepts, what it
refuses by name before anything starts, and that a resume may not switch it.

Checked on what the launcher's flags resolve to (`program_flags.make_program_inputs`)
and on `ProgramConfig.validate` with the agent and env factory `make_program` gives it.
"""

import pytest

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.envs.registry import AtariFactory, register_env
from seedacme.launchers import local, program_flags
from seedacme.run import identity
from seedacme.types import EnvFactories, EnvSpec, Mode
from tests.unit.in_process import InProcessActor

SPEC = EnvSpec((10, 5), 'float32', 3)


def _inputs(argv, tmp_path):
  args = local.parse_args([*argv, '--checkpoint_interval_s', '0'])
  return program_flags.make_program_inputs(args, str(tmp_path))


@pytest.mark.parametrize('argv', [
    ['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16'],
    ['catch', 'vtrace', '4', '4', '--agent_config', 'batch_size=8'],
    ['cartpole', 'ppo', '2', '8'],
])
def test_the_flag_makes_a_reproducible_run_of_an_unroll_queue_agent(argv, tmp_path):
  *_, builder, config = _inputs([*argv, '--reproducible'], tmp_path)
  assert config.reproducible is True
  schedule = builder.round_schedule(config.num_train_envs)
  assert schedule.num_envs == 16 and schedule.batch_size == builder.config.batch_size
  *_, config = _inputs(argv, tmp_path)
  assert config.reproducible is False  # off unless asked


@pytest.mark.parametrize('argv,match', [
    # R2D2's defaults set no samples-per-insert ratio: no learner steps per round.
    (['catch', 'r2d2', '2', '8'], r'samples_per_insert=None.*--agent_config '
                                  r'samples_per_insert'),
    # Catch's V-trace batch is 32 unrolls, two rounds of 16 envs.
    (['catch', 'vtrace', '2', '8'], r'batch_size=32.*training envs.*= 16.*batch_size=16'),
    (['cartpole', 'ppo', '3', '2'], r'batch_size=16.*= 6.*--agent_config batch_size=6'),
    (['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16', '--inference',
      'actor'], r"inference='actor' cannot run with reproducible=True"),
    (['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16', '--learner_devices',
      '2'], r"learner_devices='2' cannot run with reproducible"),
    # The evaluator plays passes by call counts: idling on a clock would hold training.
    (['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16', '--eval_interval_s',
      '60'], r'eval_interval_s=60.0 cannot run with reproducible.*--eval_interval_s at 0'),
])
def test_what_the_schedule_cannot_run_is_refused_by_name(argv, match, tmp_path):
  with pytest.raises(program_flags.ProgramArgsError, match=match):
    _inputs([*argv, '--reproducible'], tmp_path)
  _inputs(argv, tmp_path)  # without --reproducible the same run starts


def test_a_half_batch_engine_is_refused():
  """Atari's 'vector_async' sends half an actor's envs per request: a round (every env's
  request) would never fill. (A factory object only: no ale-py env is made.)"""
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(batch_size=16))
  config = ProgramConfig(num_actors=2, envs_per_actor=8, reproducible=True)
  with pytest.raises(ValueError, match=r"'vector_async' cannot run.*vector_sync"):
    config.validate(builder, AtariFactory(engine='vector_async'))
  config.validate(builder, AtariFactory(engine='vector_sync'))
  config.validate(builder, envs.make_factory('catch'))
  # The evaluator's requests too: a pass needs every evaluator env's.
  with pytest.raises(ValueError, match=r"'vector_async' cannot run"):
    config.validate(builder, EnvFactories(AtariFactory(engine='vector_sync'),
                                          AtariFactory(engine='vector_async')))
  no_evaluator = ProgramConfig(num_actors=2, envs_per_actor=8, reproducible=True,
                               num_eval_envs=0)
  no_evaluator.validate(builder, EnvFactories(AtariFactory(engine='vector_sync'),
                                              AtariFactory(engine='vector_async')))


@pytest.mark.parametrize('field,value,match', [
    ('reproducible', 1, 'reproducible must be True or False'),
    ('seed', -1, 'seed must be an int >= 0'),
    ('reproducible_lag', -1, r'reproducible_lag must be an int >= 0 \(rounds'),
    ('reproducible_lag', True, 'reproducible_lag must be an int >= 0'),
    ('reproducible_lag', 1.0, 'reproducible_lag must be an int >= 0'),
])
def test_bad_values_are_refused(field, value, match):
  with pytest.raises(ValueError, match=match):
    ProgramConfig(**{field: value}).validate()


def _identity(**config):
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(batch_size=16))
  return identity.run_identity(builder, SPEC, ProgramConfig(**{
      'env_name': 'catch', 'env_args': {}, 'num_actors': 2, 'envs_per_actor': 8, **config}))


def test_a_resume_may_not_switch_the_schedule_but_may_resplit_its_envs():
  plain, exact = _identity(), _identity(reproducible=True)
  # A run without the flag records what it did before the field existed: its saved
  # configs still resume.
  assert 'reproducible' not in plain
  assert identity.compare(plain, _identity(num_actors=4, envs_per_actor=4)) == []
  for saved, now in ((plain, exact), (exact, plain)):
    with pytest.raises(identity.RunConfigMismatchError, match='reproducible'):
      identity.compare(saved, now)
  # 2 x 8 resumed as 4 x 4 is the same run; as 2 x 4 (other seeds, other rounds) not.
  assert identity.compare(exact, _identity(reproducible=True, num_actors=4,
                                           envs_per_actor=4)) == []
  with pytest.raises(identity.RunConfigMismatchError, match='num_train_envs'):
    identity.compare(exact, _identity(reproducible=True, envs_per_actor=4))


def test_the_lag_flag_reaches_the_schedule_and_names_another_run(tmp_path):
  argv = ['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16', '--reproducible']
  *_, builder, config = _inputs([*argv, '--reproducible_lag', '1'], tmp_path)
  assert config.reproducible_lag == 1
  schedule = builder.round_schedule(config.num_train_envs, lag=config.reproducible_lag)
  assert [schedule.learner_steps_for(r) for r in range(3)] == [0, 0, 1]
  with pytest.raises(program_flags.ProgramArgsError, match='reproducible_lag must be'):
    _inputs([*argv, '--reproducible_lag', '-1'], tmp_path)
  # Lag 0 records no field (its checkpoints from before the field resume); another lag
  # is another run.
  exact = _identity(reproducible=True)
  assert 'reproducible_lag' not in exact
  with pytest.raises(identity.RunConfigMismatchError, match='reproducible_lag'):
    identity.compare(exact, _identity(reproducible=True, reproducible_lag=1))


class _UnrepeatableCatch:
  """Catch saying its episodes do not repeat under a seed (as Football's env does)."""
  not_exact_because = 'this engine does not repeat its episodes'

  def __init__(self, env):
    self._env = env

  def __getattr__(self, name):
    return getattr(self._env, name)


def test_the_launcher_reads_why_an_env_is_not_exact_from_the_env_it_creates(tmp_path):
  argv = ['catch', 'vtrace', '2', '8', '--agent_config', 'batch_size=16', '--reproducible']
  *_, config = _inputs(argv, tmp_path)
  assert config.env_not_exact is None  # Catch repeats its episodes
  real = envs.make_factory('catch').func  # the registered function
  register_env('catch', lambda seed, **kw: _UnrepeatableCatch(real(seed, **kw)))
  try:
    *_, config = _inputs(argv, tmp_path)
  finally:
    register_env('catch', real)
  assert config.env_not_exact == _UnrepeatableCatch.not_exact_because


@pytest.mark.timeout(180)
def test_a_reproducible_run_of_envs_that_are_not_exact_says_so_from_round_0(make_central):
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(batch_size=16, unroll_length=5))
  central, _, actors, _ = make_central(
      builder, 'catch', reproducible=True, max_learner_steps=3, num_eval_envs=4,
      eval_episodes=4, checkpoint_interval_s=None, export_policy=False,
      env_not_exact='its engine does not repeat an episode')
  actors.append(InProcessActor(central, envs.make_factory('catch'), 16, 4, actors[0].stop,
                               Mode.EVAL))
  for a in actors:
    a.start()
  central.run()
  summary = central.summary
  assert summary['exact_until_round'] == 0, summary
  assert summary['not_exact_because'] == 'the envs: its engine does not repeat an episode'
  assert summary['last_round'] >= 3  # the run itself went on as usual
  assert summary['eval_exact_until_pass'] == 0, summary
  assert summary['eval_not_exact_because'] == summary['not_exact_because']


def test_env_not_exact_must_be_a_reason():
  with pytest.raises(ValueError, match='env_not_exact must be a str'):
    ProgramConfig(env_not_exact=True).validate()
