"""Agent defaults that fit the program's size (agents/registry.py)."""

from seedacme.agents import registry


def test_vtrace_batch_shrinks_with_few_envs_and_overrides_win():
  batch = lambda **kw: registry.make_builder('vtrace', 'catch', **kw).config.batch_size  # noqa: E731
  assert batch() == 32  # no program size given: the env's default
  assert batch(num_train_envs=2) == 8  # 2 actors x 1 env: 4 unrolls per env
  assert batch(num_train_envs=1) == 4
  assert batch(num_train_envs=32) == 32  # 2 x 16: the default already fits
  assert batch(num_train_envs=2, batch_size=32) == 32  # an explicit choice stays
  atari = registry.make_builder('vtrace', 'atari', num_train_envs=32).config
  assert atari.batch_size == 32


def test_r2d2_defaults_do_not_depend_on_the_program_size():
  a = registry.make_builder('r2d2', 'catch', num_train_envs=2).config
  b = registry.make_builder('r2d2', 'catch').config
  assert a == b
