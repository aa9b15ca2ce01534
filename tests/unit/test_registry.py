"""Agent defaults that fit the program's size, and the V-trace core's name
(agents/registry.py, agents/vtrace/config.py)."""

import dataclasses

import pytest

from seedacme.agents import registry
from seedacme.agents.vtrace import VTraceConfig
from seedacme.launchers import program_flags


def test_vtrace_batch_shrinks_with_few_envs_and_overrides_win():
  batch = lambda **kw: registry.make_builder('vtrace', 'catch', **kw).config.batch_size  # noqa: E731
  assert batch() == 32  # no program size given: the env's default
  assert batch(num_train_envs=2) == 8  # 2 actors x 1 env: 4 unrolls per env
  assert batch(num_train_envs=1) == 4
  assert batch(num_train_envs=32) == 32  # 2 x 16: the default already fits
  assert batch(num_train_envs=2, batch_size=32) == 32  # an explicit choice stays
  atari = registry.make_builder('vtrace', 'atari', num_train_envs=32).config
  assert atari.batch_size == 8  # Atari's default (batch 8, queue 32) is already small


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
