"""Names of the environments seedacme knows, and the spec the central node needs.

Each env is a factory registered by name (`register_env`). An env may name options that
concern training envs only (`training_only`: e.g. MuJoCo's `random_first_episode`,
which cuts a first episode short): the launchers never pass those to the evaluator,
whose returns must be whole episodes. `factory_options` spells out every argument a
factory gets, defaults included, for records of what a run ran with.
"""

import dataclasses
import functools
import inspect
from typing import Any, Callable, Dict, Tuple

import dm_env

from seedacme.types import EnvFactory, EnvSpec, env_spec_of  # noqa: F401  (envs' public names)


def _make_catch(seed: int, rows: int = 10, columns: int = 5) -> dm_env.Environment:
  from seedacme.envs import catch
  return catch.make_catch(seed, rows=rows, columns=columns)


def _make_cartpole(seed: int, max_episode_steps: int = 500) -> dm_env.Environment:
  from seedacme.envs import gym_adapter
  return gym_adapter.make_gymnasium('CartPole-v1', seed,
                                    max_episode_steps=max_episode_steps)


def _make_dmlab(seed: int, level: str = 'explore_goal_locations_small') -> dm_env.Environment:
  from seedacme.envs import dmlab
  return dmlab.make_dmlab(seed, level=level)


def _make_mujoco(seed: int, level: str = 'HalfCheetah-v5',
                 max_episode_steps: int | None = None,
                 random_first_episode: bool = False,
                 contact_forces: bool | None = None) -> dm_env.Environment:
  """A gymnasium MuJoCo task; `max_episode_steps=None` keeps gymnasium's (1000).
  `random_first_episode`: the first episode cut at a random length (envs/gym_adapter.py:
  decorrelates lockstepped envs' episode phases). `contact_forces`: whether the
  observation holds the bodies' external contact forces, on the tasks that have the
  option (gymnasium's `include_cfrc_ext_in_observation`: Ant, Humanoid,
  HumanoidStandup v5); on the others it changes nothing. None (the default) is off,
  unlike gymnasium's v5 default: Ant-v5's default observation is 105 dims, 78 of them
  contact forces (v4's default had none), and with them PPO at the shared defaults of
  the time (lr 3e-4) reached a training average of 415 at 1M env steps, without them
  2,934 (seed 0; seeds 1, 2: 3,073 and 2,856;
  bench/published/mujoco_ant_no_contact_forces.json). Humanoid is not measured either
  way. None rather than False as the default keeps the recorded config of every run
  made before (`seedacme.run.identity`); a run made with the old
  default on Ant is refused on resume by its observation spec (105 dims, now 27)."""
  import gymnasium
  from seedacme.envs import gym_adapter
  kwargs = {} if max_episode_steps is None else dict(max_episode_steps=max_episode_steps)
  has_forces = _has_contact_forces(level)
  if has_forces:
    kwargs['include_cfrc_ext_in_observation'] = bool(contact_forces)
  elif contact_forces and has_forces is not None:
    raise ValueError(f'contact_forces=True: the MuJoCo task {level!r} has no contact '
                     'forces to add to its observation')
  kwargs['random_first_episode'] = random_first_episode
  try:
    return gym_adapter.make_gymnasium(level, seed, **kwargs)
  except gymnasium.error.Error as e:  # an unknown id, or mujoco not installed
    raise ValueError(f'cannot make the MuJoCo task {level!r}: {e}') from e


@functools.cache
def _has_contact_forces(level: str) -> bool | None:
  """Whether a gymnasium task takes `include_cfrc_ext_in_observation` (None for an
  unknown id: making it fails with gymnasium's own message). Once per task: every env
  of an actor asks."""
  import gymnasium
  from gymnasium.envs.registration import load_env_creator
  try:
    creator = load_env_creator(gymnasium.spec(level).entry_point)
  except gymnasium.error.Error:
    return None
  return 'include_cfrc_ext_in_observation' in inspect.signature(creator).parameters


def _make_football(seed: int, scenario: str = '11_vs_11_easy_stochastic',
                   **kwargs) -> dm_env.Environment:
  from seedacme.envs import football
  return football.make_football(seed, scenario=scenario, **kwargs)


ENGINES = ('python', 'vector_sync', 'vector_async')


@dataclasses.dataclass(frozen=True)
class AtariFactory:
  """Atari's env factory: `factory(seed)` is one env (envs/atari.py); `make_engine` K.

  `engine` chooses how an actor steps its K envs: 'python' (`BatchedEnv`, a loop over K
  gymnasium envs), 'vector_sync' or 'vector_async' (ale-py's C++ engine, all K at once
  or as two half batches; envs/atari_vector.py). `num_threads` is the C++ engine's
  worker threads (0: one per core).
  """
  game: str = 'Pong'
  # How the envs are stepped, not which: not part of a run's config on resume
  # (seedacme.run.identity).
  engine: str = dataclasses.field(default='python', metadata={'run_identity': False})
  num_threads: int = dataclasses.field(default=0, metadata={'run_identity': False})
  noop_max: int = 30
  frame_skip: int = 4
  frame_stack: int = 4
  repeat_action_probability: float = 0.0
  full_action_space: bool = False

  def __post_init__(self):
    if self.engine not in ENGINES:
      raise ValueError(f'unknown env engine {self.engine!r}; known: {", ".join(ENGINES)}')

  def _preprocessing(self) -> dict:
    return dict(noop_max=self.noop_max, frame_skip=self.frame_skip,
                frame_stack=self.frame_stack, full_action_space=self.full_action_space,
                repeat_action_probability=self.repeat_action_probability)

  def __call__(self, seed: int) -> dm_env.Environment:
    from seedacme.envs import atari
    return atari.make_atari(seed, game=self.game, **self._preprocessing())

  def make_engine(self, num_envs: int, seed: int = 0):
    """K envs (env i seeded with seed + i) stepped by the chosen engine."""
    if self.engine == 'python':
      from seedacme.actor.engines import BatchedEnv
      return BatchedEnv(self, num_envs, seed=seed)
    from seedacme.envs import atari_vector
    return atari_vector.make_vector_engine(self.engine, self.game, num_envs, seed,
                                           num_threads=self.num_threads,
                                           **self._preprocessing())


# Environments by name: `factory(seed, **kwargs)` (a function, or a factory class such
# as `AtariFactory` whose instances carry their settings and engine to the actors).
_FACTORIES: Dict[str, Callable[..., Any]] = {}
_TRAINING_ONLY: Dict[str, Tuple[str, ...]] = {}  # options never given to the evaluator


def register_env(name: str, factory: Callable[..., Any],
                 training_only: Tuple[str, ...] = ()) -> None:
  """Makes `name` known to every launcher (`make_factory(name, **kwargs)`);
  `training_only`: its options that the evaluator's envs never get."""
  _FACTORIES[name] = factory
  _TRAINING_ONLY[name] = tuple(training_only)


def training_only_options(name: str) -> Tuple[str, ...]:
  """The options of env `name` that only training envs get (see `register_env`)."""
  return _TRAINING_ONLY.get(name, ())


def env_names() -> Tuple[str, ...]:
  return tuple(sorted(_FACTORIES))


register_env('atari', AtariFactory)
register_env('catch', _make_catch)
register_env('cartpole', _make_cartpole)
register_env('dmlab', _make_dmlab)
register_env('football', _make_football)
register_env('mujoco', _make_mujoco, training_only=('random_first_episode',))
ENV_NAMES = env_names()  # the built-in ones


def make_factory(name: str, **kwargs) -> EnvFactory:
  """Returns a picklable `factory(seed) -> dm_env.Environment` for `name`.

  `engine` (see `ENGINES`) picks how actors step their envs; only Atari has engines
  other than 'python'.
  """
  try:
    fn = _FACTORIES[name]
  except KeyError:
    raise ValueError(
        f'Unknown environment {name!r}; known: {", ".join(env_names())}') from None
  if isinstance(fn, type):  # a factory class (Atari): its instance is the factory
    return fn(**kwargs)
  engine = kwargs.pop('engine', 'python')
  if engine != 'python':
    raise ValueError(f'{name} has no env engine {engine!r}; only atari has vector engines')
  return functools.partial(fn, **kwargs)


def factory_options(name: str, **kwargs) -> Dict[str, Any]:
  """Every argument `make_factory(name, **kwargs)` hands the env, defaults filled in
  (not the seed, nor the engine, which only steps the envs): the env's full config."""
  kwargs.pop('engine', None)
  fn = _FACTORIES[name]
  if isinstance(fn, type):  # a factory class: its fields are its arguments
    options = dataclasses.asdict(fn(**kwargs))
  else:
    signature = inspect.signature(fn)
    bound = signature.bind_partial(**kwargs)
    bound.apply_defaults()
    options = {}
    for key, value in bound.arguments.items():
      if signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
        options.update(value)  # e.g. football's extra arguments
      else:
        options[key] = value
  options.pop('seed', None)
  options.pop('engine', None)
  return options
