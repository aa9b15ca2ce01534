"""Agent defaults that fit the program's size, the V-trace core's name, and fields of
the wrong type refused (agents/registry.py, agents/*/config.py, seedacme/config.py)."""

import dataclasses
import re

import numpy as np
import pytest

from seedacme.agents import registry
from seedacme.agents.ppo import PPOConfig
from seedacme.agents.r2d2 import R2D2Config
from seedacme.agents.sac import SACConfig
from seedacme.agents.vtrace import VTraceConfig
from seedacme.launchers import local, program_flags


def test_vtrace_batch_shrinks_with_few_envs_and_overrides_win():
  batch = lambda **kw: registry.make_builder('vtrace', 'catch', **kw).config.batch_size  # noqa: E731
  assert batch() == 32  # no program size given: the env's default
  assert batch(num_train_envs=2) == 8  # 2 actors x 1 env: 4 unrolls per env
  assert batch(num_train_envs=1) == 4
  assert batch(num_train_envs=32) == 32  # 2 x 16: the default already fits
  assert batch(num_train_envs=2, batch_size=32) == 32  # an explicit choice stays
  atari = registry.make_builder('vtrace', 'atari', num_train_envs=32).config
  assert atari.batch_size == 8  # Atari's default (batch 8, queue 32) is already small


def test_ppo_atari_batch_is_one_round_of_the_envs_and_overrides_win():
  """The published Pong runs' 2 x 16 envs: 32 unrolls a batch, a queue of one unroll
  (the envs act one round ahead of the learner: lag ~1), 16 minibatches of 256
  transitions. Fewer envs: the batch follows the envs (CleanRL's 8 envs: 8 x 128 in 4
  minibatches; 1 env: one minibatch of its 128 steps); more: stays 32. A queue given
  explicitly stays, one larger than the batch is cut to it."""
  def config(**kw):
    c = registry.make_config('ppo', 'atari', **kw)
    return c.batch_size, c.queue_size, c.num_minibatches
  assert config() == (32, 1, 16)  # no program size given: the published defaults
  assert config(num_train_envs=32) == (32, 1, 16)
  assert config(num_train_envs=64) == (32, 1, 16)
  assert config(num_train_envs=8) == (8, 1, 4)
  assert config(num_train_envs=2) == (2, 1, 1)
  assert config(num_train_envs=1) == (1, 1, 1)
  assert config(num_train_envs=6) == (6, 1, 3)  # 768 transitions: 3 of 256
  assert config(num_train_envs=5) == (5, 1, 2)  # 640: 2 of 320 (2.5 would not split)
  # An explicit choice stays; what follows from it is still fitted.
  assert config(num_train_envs=2, batch_size=8) == (8, 1, 4)
  assert config(num_train_envs=2, queue_size=16) == (2, 16, 1)
  assert config(num_train_envs=32, queue_size=32) == (32, 32, 16)  # the b32 run's pipeline
  assert config(num_train_envs=32, num_minibatches=4) == (32, 1, 4)
  # An LSTM core splits whole unrolls: 8 unrolls in 4 minibatches of 2; 3 unrolls of
  # 128 in 1 (1.5 would not split).
  assert config(num_train_envs=8, core='lstm') == (8, 1, 4)
  assert config(num_train_envs=3, core='lstm') == (3, 1, 1)
  # Other envs keep their defaults whatever the program's size.
  for env in ('mujoco', 'cartpole', 'catch'):
    assert (registry.make_config('ppo', env, num_train_envs=2)
            == registry.make_config('ppo', env))


def test_ppo_halfcheetah_has_its_published_settings_other_levels_the_envs():
  """HalfCheetah-v5's published run (std 0.5, 4 epochs) is its default; Hopper-v5 and
  a level without an entry keep MuJoCo's (std 1, 10 epochs); a flag still wins, and
  the launcher resolves the level, named or the env's default, to the same."""
  def std_epochs(config):
    return round(config.init_log_std, 2), config.epochs
  cheetah = registry.make_config('ppo', 'mujoco', 16, task='HalfCheetah-v5')
  assert std_epochs(cheetah) == (-0.69, 4)
  assert cheetah.learning_rate_decay_steps == 490  # the env's defaults still apply
  for task in ('Hopper-v5', 'Walker2d-v5', None):
    assert std_epochs(registry.make_config('ppo', 'mujoco', 16, task=task)) == (0.0, 10)
  assert registry.make_config('ppo', 'mujoco', 16, task='HalfCheetah-v5',
                              epochs=10).epochs == 10
  # V-trace has no per-task entry: the level changes nothing.
  assert (registry.make_config('vtrace', 'mujoco', 16, task='HalfCheetah-v5')
          == registry.make_config('vtrace', 'mujoco', 16, task='Hopper-v5'))
  for argv, expected in ((['mujoco', 'ppo', '2', '8', '--level', 'HalfCheetah-v5'], 4),
                         (['mujoco', 'ppo', '2', '8'], 4),  # the env's default level
                         (['mujoco', 'ppo', '2', '8', '--level', 'Hopper-v5'], 10)):
    resolved = program_flags.resolved_run(local.parse_args(argv))
    assert resolved['agent_config_full']['epochs'] == expected, argv


def test_r2d2_defaults_do_not_depend_on_the_program_size():
  a = registry.make_builder('r2d2', 'catch', num_train_envs=2).config
  b = registry.make_builder('r2d2', 'catch').config
  assert a == b


def test_vtrace_core_is_named_apart_from_the_torso_and_the_old_name_still_works(caplog):
  """`core` ('feedforward' | 'lstm') follows the `torso`; `network=` is its old name."""
  assert registry.make_builder('vtrace', 'catch').config.core == 'feedforward'
  assert registry.make_builder('vtrace', 'dmlab').config.core == 'lstm'
  assert 'network' not in {f.name for f in dataclasses.fields(VTraceConfig)}
  with caplog.at_level('WARNING'):
    old = registry.make_builder('vtrace', 'atari',
                                **program_flags.parse_overrides(['network=lstm'])).config
  assert (old.core, old.torso) == ('lstm', 'nature_cnn')
  assert "network='lstm' is deprecated; use core='lstm'" in caplog.text
  assert VTraceConfig(network='mlp').core == 'feedforward'
  with pytest.raises(ValueError, match='core'):
    VTraceConfig(core='mlp')  # a torso's name is not a core
  with pytest.raises(ValueError, match='now core'):
    VTraceConfig(network='gru')


def test_each_agent_config_refuses_a_field_of_the_wrong_scalar_type():
  """Built directly in Python, not only through the registry: each config refuses a
  scalar field of the wrong type naming the config, the field and the value, and
  takes numpy's ints and floats."""
  for config_class, field, value, expected in (
      (PPOConfig, 'learning_rate', '3e-4', 'float'),
      (SACConfig, 'batch_size', 256.0, 'int'),
      (R2D2Config, 'discount', None, 'float'),
      (VTraceConfig, 'normalize_observations', 1, 'bool')):
    config_class()  # the defaults pass
    with pytest.raises(ValueError, match=re.escape(
        f'{config_class.__name__}.{field}={value!r}: expected {expected}')):
      config_class(**{field: value})
  config = PPOConfig(epochs=np.int64(4), learning_rate=np.float32(1e-4))
  assert config.epochs == 4
  with pytest.raises(ValueError, match='PPOConfig.epochs=True: expected int'):
    dataclasses.replace(config, epochs=True)  # a replace is checked too


def test_an_override_of_the_wrong_scalar_type_is_refused_naming_the_field():
  """What the checks let through: an int for a float, None where the field
  allows it, a tuple for a tuple field (the config's own checks); what they refuse
  names the config, the field, the value and the type."""
  config = registry.make_config('ppo', 'mujoco', learning_rate=1, kl_ceiling=None,
                                hidden_sizes=(32, 32))
  assert config.learning_rate == 1 and config.hidden_sizes == (32, 32)
  for override, message in (
      (dict(learning_rate='3e-4'), "PPOConfig.learning_rate='3e-4': expected float"),
      (dict(epochs=True), 'PPOConfig.epochs=True: expected int'),
      (dict(normalize_rewards=1), 'normalize_rewards=1: expected bool'),
      (dict(kl_ceiling='x'), "kl_ceiling='x': expected float or None"),
      (dict(learning_rate=None), 'learning_rate=None: expected float')):
    with pytest.raises(ValueError, match=re.escape(message)):
      registry.make_config('ppo', 'mujoco', **override)
