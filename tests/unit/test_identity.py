"""The run's saved config (`seedacme.run.identity`): what counts as another run.

The compared fields, flattened and named as the refusal names them; budgets, actor
counts and the env engine never count; a field one side lacks counts; a program
composed in Python is told apart by its env factory (on ce34d39 Pong resumed as
Breakout: equal specs); a checkpoint without a saved config is refused unless
`--allow_config_change '*'` (on ce34d39 it adopted any config);
`--allow_config_change` takes exact field paths only (on ce34d39 `game` allowed any
field named game); a config left without a checkpoint does not bind the next run.
"""

import functools
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from seedacme import envs
from seedacme.agents import r2d2, vtrace
from seedacme.config import ProgramConfig
from seedacme.launchers import local, program_flags
from seedacme.learner.checkpointing import Checkpointer
from seedacme.nodes import program as program_lib
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
                                   'env_args.level', 'seed']
  assert ('agent_config.hidden_sizes', [64, 64], [32]) in diffs
  assert ('env_args.level', identity.MISSING, 'x') in diffs  # only one side has it
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


def _composed(factory, spec=SPEC, **config):
  """The identity of a program composed in Python: no env name, the factory's own."""
  return _identity(spec=spec, env_name=None,
                   env_factory_identity=identity.factory_identity(factory), **config)


def test_a_program_composed_in_python_compares_its_env_factory():
  """On ce34d39 a composed program compared the env's spec only: Pong resumed as
  Breakout (both 84x84x4 uint8, 6 actions with the minimal action set)."""
  atari = EnvSpec((84, 84, 4), 'uint8', 6)
  pong = _composed(envs.make_factory('atari', game='Pong'), atari)
  breakout = _composed(envs.make_factory('atari', game='Breakout'), atari)
  assert identity.differences(pong, breakout) == [
      ('env_factory.args.game', 'Pong', 'Breakout')]
  with pytest.raises(identity.RunConfigMismatchError,
                     match='--allow_config_change env_factory.args.game$'):
    identity.compare(pong, breakout)
  # The engine steps the same envs; another factory's arguments are another env.
  assert identity.differences(pong, _composed(
      envs.make_factory('atari', game='Pong', engine='vector_sync'), atari)) == []
  catch = _composed(envs.make_factory('catch'))
  assert identity.differences(catch, _composed(envs.make_factory('catch', rows=12))) == [
      ('env_factory.args.rows', 10, 12)]
  assert [d[0] for d in identity.differences(
      catch, _composed(functools.partial(_my_env, size=3)))] == [
          'env_factory.args.columns', 'env_factory.args.rows', 'env_factory.args.size',
          'env_factory.factory']
  # Arguments that are not plain data are named by type, never by address.
  assert identity.factory_identity(functools.partial(_my_env, size=object()))['args'] == {
      'size': '<builtins.object object>'}
  assert identity.differences(catch, _composed(envs.make_factory('catch'),
                                               EnvSpec((4,), 'float32', 3)))


def _my_env(seed, size=2):
  return seed, size


def test_a_launcher_run_and_a_composed_one_compare_what_both_have(tmp_path):
  """The launcher names the env (`env`, `env_args`); a composed program does not. Both
  record the factory, and that is compared."""
  args = local.parse_args(['catch', 'vtrace', '2', '--checkpoint_interval_s', '0'])
  factory, spec, builder, config = program_flags.make_program_inputs(args, str(tmp_path))
  launched = identity.run_identity(builder, spec, config)
  assert launched['env'] == 'catch' and launched['env_factory'] == {
      'factory': 'seedacme.envs.registry._make_catch', 'args': {'rows': 10, 'columns': 5}}
  # What `make_program` hands the central node, for a composed program as for this one.
  composed = ProgramConfig(num_eval_envs=0, supervise=False, checkpoint_interval_s=None,
                           logdir=str(tmp_path))
  program = program_lib.make_program(builder, envs.make_factory('catch'), spec, composed,
                                     name='t')
  node_config = program.groups['learner'][0]._kwargs['config']  # pylint: disable=protected-access
  assert node_config.env_factory_identity == launched['env_factory']
  assert identity.differences(launched, identity.run_identity(builder, spec, node_config)) == []
  program = program_lib.make_program(builder, envs.make_factory('catch', rows=7), spec,
                                     composed, name='t')
  node_config = program.groups['learner'][0]._kwargs['config']  # pylint: disable=protected-access
  assert identity.differences(launched, identity.run_identity(builder, spec, node_config)) == [
      ('env_factory.args.rows', 10, 7)]


def test_a_field_only_one_side_has_is_a_difference_and_the_refusal_says_how_to_allow_it():
  """A config saved by older code lacks the fields added since (here `env_factory`);
  on ce34d39 such a field was skipped."""
  current = _composed(envs.make_factory('catch'))
  older = {k: v for k, v in current.items() if k != 'env_factory'}
  older['agent_config'] = {k: v for k, v in older['agent_config'].items()
                           if k != 'entropy_cost'}
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    identity.compare(older, current)
  message = str(raised.value)
  assert 'agent_config.entropy_cost: saved <missing>, now 0.01' in message
  assert "env_factory: saved <missing>, now {'factory': 'seedacme.envs.registry._make_catch'" \
      in message
  assert '<missing>: that side\'s config has no such field' in message
  assert message.endswith('--allow_config_change agent_config.entropy_cost,env_factory')
  assert len(identity.compare(older, current, ['agent_config.entropy_cost',
                                               'env_factory'])) == 2
  with pytest.raises(identity.RunConfigMismatchError, match='saved 0.01, now <missing>'):
    identity.compare(current, older, ['env_factory'])  # a field since removed


def test_allowed_changes_by_exact_path_only_and_the_refusal_lists_the_paths():
  saved = _identity()
  changed = _identity(vtrace.VTraceConfig(learning_rate=3e-4, entropy_cost=0.0))
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    identity.compare(saved, changed, ['agent_config.learning_rate'])
  assert 'agent_config.entropy_cost: saved 0.01, now 0.0' in str(raised.value)
  assert 'learning_rate' not in str(raised.value)
  assert str(raised.value).endswith('--allow_config_change agent_config.entropy_cost')
  assert len(identity.compare(saved, changed, ['agent_config.learning_rate',
                                               'agent_config.entropy_cost'])) == 2
  # A bare name allows nothing (on ce34d39 it allowed any field of that name), and the
  # refusal says so.
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    identity.compare(saved, changed, ['learning_rate', 'entropy_cost'])
  assert 'learning_rate,entropy_cost names no field' in str(raised.value)
  assert str(raised.value).endswith(
      '--allow_config_change agent_config.entropy_cost,agent_config.learning_rate')
  pong, breakout = (_identity(env_name='atari', env_args={'game': g}) for g in ('Pong', 'Breakout'))
  with pytest.raises(identity.RunConfigMismatchError, match='env_args.game$'):
    identity.compare(pong, breakout, ['game'])
  assert identity.compare(pong, breakout, ['env_args.game']) == [
      ('env_args.game', 'Pong', 'Breakout')]
  assert len(identity.compare(saved, changed, ['*'])) == 2


def test_a_checkpoint_saved_without_its_config_is_refused_unless_adopted(tmp_path):
  """On ce34d39 such a checkpoint was restored and this run's config saved as its own."""
  directory = str(tmp_path / identity.CHECKPOINTS)
  weights = tf.Variable(np.arange(3, dtype=np.float32))
  Checkpointer(directory, {'weights': weights}).save({'learner_steps': 7})  # no identity
  current = _identity()
  events = []
  resumed = Checkpointer(directory, {'weights': tf.Variable(np.zeros(3, np.float32))},
                         identity=current, log_event=events.append)
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    resumed.restore()
  assert "no saved run config" in str(raised.value)
  assert "--allow_config_change '*'" in str(raised.value)
  assert events == [str(raised.value)]
  assert identity.read_saved(directory) is None  # nothing adopted
  # Naming the fields is not enough: nothing says which run it was.
  with pytest.raises(identity.RunConfigMismatchError, match='no saved run config'):
    identity.check_resume(directory, current, ['agent_config.core'])
  adopted = Checkpointer(directory, {'weights': tf.Variable(np.zeros(3, np.float32))},
                         identity=current, allow_changes=['*'], log_event=events.append)
  assert adopted.restore()['learner_steps'] == 7
  assert 'resumed a checkpoint saved without its run config' in events[-1]
  saved = json.load(open(identity.config_path(directory)))
  assert saved['config'] == current
  assert saved['changes'][-1]['learner_step'] == 7
  assert saved['changes'][-1]['fields']['seed'] == ['<missing>', 0]
  assert identity.check_resume(directory, current) == []  # this run from now on


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
                              '--allow_config_change', 'agent_config.core'])
  assert program_flags.make_program_inputs(allowed, logdir)[3].allow_config_change == (
      'agent_config.core',)
  bare = local.parse_args(['catch', 'vtrace', '2', '--agent_config', 'core=lstm',
                           '--allow_config_change', 'core'])
  with pytest.raises(program_flags.ProgramArgsError,
                     match='--allow_config_change agent_config.core$'):
    program_flags.make_program_inputs(bare, logdir)
  # A checkpoint without its config: refused by the launcher as well.
  os.remove(identity.config_path(checkpoints))
  with pytest.raises(program_flags.ProgramArgsError, match='no saved run config'):
    program_flags.make_program_inputs(same, logdir)
  adopt = local.parse_args(['catch', 'vtrace', '2', '--allow_config_change', '*'])
  program_flags.make_program_inputs(adopt, logdir)


def _atari_of(game):
  """A composed program's env factory as a closure (issue 62: on c8a4f53 every
  `_atari_of(...)` had one identity, and Pong resumed as Breakout)."""
  def factory(seed):
    return envs.make_factory('atari', game=game)(seed)
  return factory


def _catch_of(rows):
  return lambda seed: envs.make_factory('catch', rows=rows)(seed)


class _Maker:
  """Envs made by a bound method: the object's fields say which."""

  def __init__(self, game, sticky=0.25):
    self.game, self.sticky = game, sticky

  def make(self, seed, frame_skip=4):
    return envs.make_factory('atari', game=self.game)(seed), frame_skip


class _Settings:
  """An arbitrary object: nothing says what it holds."""

  def __init__(self, game):
    self.game = game


def test_closures_and_lambdas_are_told_apart_by_what_they_capture():
  atari = EnvSpec((84, 84, 4), 'uint8', 6)
  pong, breakout = (_composed(_atari_of(g), atari) for g in ('Pong', 'Breakout'))
  assert identity.differences(pong, breakout) == [
      ('env_factory.captures.game', 'Pong', 'Breakout')]
  with pytest.raises(identity.RunConfigMismatchError,
                     match='--allow_config_change env_factory.captures.game$'):
    identity.compare(pong, breakout)
  assert identity.compare(pong, _composed(_atari_of('Pong'), atari)) == []  # exact: resumes
  assert 'exact' not in pong['env_factory']
  assert identity.differences(_composed(_catch_of(10)), _composed(_catch_of(12))) == [
      ('env_factory.captures.rows', 10, 12)]
  # A lambda that captures nothing: told apart by the constants and names it uses.
  ten, twelve = (lambda seed: _my_env(seed, 10)), (lambda seed: _my_env(seed, 12))
  assert [d[0] for d in identity.differences(_composed(ten), _composed(twelve))] == [
      'env_factory.code.constants']
  other = lambda seed: envs.make_factory('catch')(seed)  # noqa: E731
  assert 'env_factory.code.names' in {d[0] for d in identity.differences(
      _composed(ten), _composed(other))}
  # A partial of a closure: the closure's captures and the partial's arguments.
  assert identity.factory_identity(functools.partial(_catch_of(7), seed=3)) == {
      'factory': identity.factory_identity(_catch_of(7))['factory'], 'args': {'seed': 3},
      'captures': {'rows': 7}, 'code': identity.factory_identity(_catch_of(7))['code']}


def test_a_bound_method_is_told_apart_by_its_objects_fields():
  pong, breakout = (_composed(_Maker(g).make) for g in ('Pong', 'Breakout'))
  assert pong['env_factory']['factory'].endswith('_Maker.make')
  assert pong['env_factory']['args'] == {'frame_skip': 4}
  assert identity.differences(pong, breakout) == [
      ('env_factory.self.args.game', 'Pong', 'Breakout')]
  assert identity.differences(pong, _composed(_Maker('Pong', sticky=0.0).make)) == [
      ('env_factory.self.args.sticky', 0.25, 0.0)]
  assert identity.differences(pong, _composed(functools.partial(
      _Maker('Pong').make, frame_skip=1))) == [('env_factory.args.frame_skip', 4, 1)]
  assert identity.compare(pong, _composed(_Maker('Pong').make)) == []


def test_a_factory_holding_what_cannot_be_described_refuses_resume_unless_named(tmp_path):
  """A closure over an arbitrary object: two runs' identities would be equal whatever
  the object holds, so the identity says it is not exact and a resume is refused,
  naming the override; with `--allow_config_change env_factory.exact` it goes on."""
  def closure_over(settings):
    return lambda seed: envs.make_factory('atari', game=settings.game)(seed)
  current = _composed(closure_over(_Settings('Breakout')))
  factory = current['env_factory']
  assert factory['exact'] is False
  assert factory['inexact'] == [
      f'captures.settings: a {_Settings.__module__}._Settings object']
  directory = str(tmp_path / identity.CHECKPOINTS)
  identity.save(directory, _composed(closure_over(_Settings('Pong'))), fresh=True)
  open(os.path.join(directory, 'checkpoint'), 'w').write('model_checkpoint_path: "c-1"\n')
  with pytest.raises(identity.RunConfigMismatchError) as raised:
    identity.check_resume(directory, current)
  message = str(raised.value)
  assert 'described only in part' in message and 'captures.settings' in message
  assert message.endswith('--allow_config_change env_factory.exact')
  assert identity.check_resume(directory, current, ['env_factory.exact']) == []
  # Another difference besides: both named, each allowed by its own path only.
  with pytest.raises(identity.RunConfigMismatchError,
                     match='--allow_config_change seed,env_factory.exact$'):
    identity.check_resume(directory, _composed(closure_over(_Settings('Pong')), seed=5))
  with pytest.raises(identity.RunConfigMismatchError, match='--allow_config_change seed$'):
    identity.check_resume(directory, _composed(closure_over(_Settings('Pong')), seed=5),
                          ['env_factory.exact'])
  # A saved exact factory, an inexact one now: the field differs, and it is named.
  exact = str(tmp_path / 'exact')
  identity.save(exact, _composed(_atari_of('Pong')), fresh=True)
  open(os.path.join(exact, 'checkpoint'), 'w').write('model_checkpoint_path: "c-1"\n')
  with pytest.raises(identity.RunConfigMismatchError, match='env_factory.exact: saved <missing>'):
    identity.check_resume(exact, current)
