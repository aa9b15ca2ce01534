"""Environments for seedacme actors.

Everything here is importable without TensorFlow: actor processes import this package
and nothing that holds a model. An *environment factory* is a picklable callable
`factory(seed: int) -> dm_env.Environment`; actors build their K envs from it.

    from seedacme import envs
    factory = envs.make_factory('catch')
    env = factory(seed=0)
"""

from seedacme.envs.registry import make_factory, ENV_NAMES

from seedacme.types import EnvSpec, env_spec_of

__all__ = ['EnvSpec', 'make_factory', 'env_spec_of', 'ENV_NAMES']
