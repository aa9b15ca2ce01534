"""The program's flags, defined once for every launcher (`run_local`, `vertex`, `cluster`).

A program is the same whichever launcher starts it: env, agent, actors, budgets,
evaluation, checkpoints, agent and env overrides. `add_program_args` adds those flags
to a launcher's parser (launch-specific flags -- hardware, network, dry run -- stay in
the launcher) and `make_program_inputs` turns parsed flags into the env factory, spec,
builder and `ProgramConfig`, with a clear error (`ProgramArgsError`) naming a bad flag.

Env options: the training envs get the agent's training-env defaults from the registry
(e.g. PPO's `random_first_episode` on MuJoCo) under the user's `--env_config`; the
evaluator's envs get neither those nor any option the env marks training-only, so its
returns stay whole episodes (`EnvFactories`). `resolved_run` is what a run resolves
to (the agent's config dataclass, the training envs' options): benchmarks record it and
tests compare commands by it, with this module's code rather than a copy.

Budgets: the launcher's time budget (`max_seconds` of `add_program_args`) is a default
that applies only when no budget flag is given; `--max_env_steps 1000000` alone runs to
its env steps. A logdir that holds a checkpoint is resumed only by the same run: its
saved config is compared here, before anything starts, when the logdir is local (the
central node compares it again, wherever the logdir is; `seedacme.run.identity`).
"""

import argparse
import ast
import dataclasses
import json
import os
from typing import Any, Dict, List, Tuple

from seedacme import envs
from seedacme.agents import registry as agents
from seedacme.config import ProgramConfig
from seedacme.envs.registry import ENGINES, env_names, factory_options, training_only_options
from seedacme.run import identity
from seedacme.types import EnvFactories, Mode, factory_for


class ProgramArgsError(ValueError):
  """A program flag that cannot be used (the message names it)."""


def add_program_args(parser: argparse.ArgumentParser, envs_per_actor: int = 16,
                     max_seconds: float = 120.0, logdir_help: str = '',
                     standby_restarts: bool = False) -> None:
  """Adds the program's flags; the defaults that differ per launcher are arguments."""
  parser.add_argument('env', choices=env_names())
  parser.add_argument('agent', choices=agents.agent_names())
  parser.add_argument('num_actors', type=int)
  parser.add_argument('envs_per_actor', type=int, nargs='?', default=envs_per_actor)
  parser.add_argument('--max_seconds', type=float, default=None,
                      help='stop after this many seconds of running, counted over every '
                      f'start of the run (0: no limit; default: {max_seconds:g} when no '
                      'budget flag is given)')
  parser.set_defaults(default_max_seconds=max_seconds)
  parser.add_argument('--max_learner_steps', type=int, default=0, help='0: no limit')
  parser.add_argument('--max_env_steps', type=int, default=0, help='0: no limit')
  parser.add_argument('--allow_config_change', action='append', default=[],
                      metavar='PATH[,PATH]',
                      help='resume a logdir whose saved run config differs in these fields, '
                      'named by their exact paths as the refusal lists them (e.g. '
                      "agent_config.learning_rate, env_args.game); '*': any field, and a "
                      'checkpoint saved without a run config (this one adopted); without '
                      'it a resume with another config is refused')
  parser.add_argument('--target_return', type=float, default=None,
                      help='stop once the average return reaches this')
  parser.add_argument('--target_on', choices=('train', 'eval'), default='train',
                      help='which return --target_return watches: training episodes '
                      '(last 100) or the greedy evaluator (last 20)')
  parser.add_argument('--num_eval_envs', type=int, default=4)
  parser.add_argument('--eval_interval_s', type=float, default=0.0,
                      help='evaluate --eval_episodes greedy episodes this often (0: always)')
  parser.add_argument('--eval_episodes', type=int, default=20)
  parser.add_argument('--inference_batch_envs', type=int, default=0,
                      help='the policy runs as soon as it is free and this many envs wait '
                      '(1: whatever is queued; 0: the default of ProgramConfig)')
  parser.add_argument('--inference_timeout_ms', type=float, default=2.0,
                      help='... or once the first waiting request is this old')
  parser.add_argument('--logdir', default=None, help=logdir_help)
  parser.add_argument('--seed', type=int, default=0,
                      help="the run's seed (>= 0): envs (by global env id), initial weights, "
                      'action sampling and minibatch order')
  parser.add_argument('--reproducible', action='store_true',
                      help='the round schedule: the same command and seed give the same '
                      'run whatever the number of actors, hosts or the load (V-trace and '
                      'PPO, central inference; the learner batch must divide the '
                      'training envs)')
  parser.add_argument('--reproducible_lag', type=int, default=0,
                      help='with --reproducible: round r acts with the weights trained on '
                      'rounds up to r-1-LAG. 0: acting and learning take turns; 1: round r '
                      'acts while the learner trains on round r-1 (both exact; each its '
                      'own run)')
  parser.add_argument('--reproducible_threads', type=int, default=2,
                      help="with --reproducible: TensorFlow's intra-op threads on the "
                      'central node (fixed: reductions split by it; another count is '
                      'another run)')
  parser.add_argument('--game', default=None, help='Atari game (default Pong)')
  parser.add_argument('--env_engine', choices=ENGINES, default='python',
                      help="how actors step their envs: python (a loop over K envs), "
                      "vector_sync/vector_async (Atari only: ale-py's C++ engine, all K at "
                      "once or two halves of K/2 overlapped with inference)")
  parser.add_argument('--level', default=None,
                      help='DMLab level (a DMLab-30 name or a level script path), or the '
                      'MuJoCo task (gymnasium id, e.g. HalfCheetah-v5)')
  parser.add_argument('--scenario', default=None,
                      help='Football scenario (default 11_vs_11_easy_stochastic)')
  parser.add_argument('--env_config', action='append', default=[], metavar='ARG=VALUE',
                      help="an extra argument of the env's factory, e.g. --env_config "
                      "representation=simple115v2 (repeatable; like --agent_config)")
  parser.add_argument('--progress_interval_s', type=float, default=5.0)
  parser.add_argument('--learner_step_delay_s', type=float, default=0.0,
                      help='testing: pause after each learner step (a slow learner)')
  parser.add_argument('--inference', choices=('central', 'actor'), default='central',
                      help="central: SEED, one batched policy on the learner node for all "
                      "actors; actor: Acme's pattern, every actor runs its own network copy "
                      "and pulls parameters from the learner")
  parser.add_argument('--inference_devices', default=None, metavar='DEVICES',
                      help="central node's inference device: a name ('GPU:0') or a count "
                           "(default: the first accelerator, else the CPU)")
  parser.add_argument('--learner_devices', default=None, metavar='DEVICES',
                      help="learner devices: names ('GPU:1,GPU:2') or a count; several "
                           'run the learner data-parallel (default: the accelerators '
                           'after the inference one, else the inference device)')
  parser.add_argument('--logical_cpus', type=int, default=0,
                      help='split the central node\'s CPU into N logical devices (to '
                           'try placements on a CPU-only machine)')
  parser.add_argument('--policy_copy', action='store_true',
                      help='inference serves a copy of the policy taken after each '
                           'learner step (default: it reads the learner\'s variables, '
                           'also while a learner step changes them)')
  parser.add_argument('--transport', choices=('auto', 'courier', 'shm'), default='auto',
                      help="central inference requests from actors on the central node's "
                      "host: auto (shared memory; Courier between hosts), courier (always "
                      "Courier, for comparison), shm (shared memory or fail)")
  parser.add_argument('--variable_update_period', type=int, default=100,
                      help='--inference actor: fetch parameters every this many calls')
  parser.add_argument('--acting_nice', type=int, default=0,
                      help='renice actor and evaluator processes by this much (0-19): the '
                      "central node's inference and learner win the CPU when both run")
  parser.add_argument('--acting_only', action='store_true',
                      help='no learner and no trajectories: measures acting throughput')
  parser.add_argument('--agent_config', action='append', default=[], metavar='FIELD=VALUE',
                      help="override a field of the agent's config dataclass, e.g. "
                      "--agent_config torso=impala_resnet --agent_config "
                      "learning_rate=3e-4 (repeatable; values are Python literals or "
                      "strings)")
  parser.add_argument('--standby_restarts', action=argparse.BooleanOptionalAction,
                      default=standby_restarts,
                      help='replay and central nodes keep a standby process with Reverb/TF '
                      'imported that takes over at once when theirs dies (one more '
                      'process each, ~450 MB for the central one)')
  parser.add_argument('--env_step_timeout_s', type=float, default=60.0,
                      help="an env step or reset that takes longer is a hung env: "
                      "reported, its actor restarted (0: no watchdog)")
  parser.add_argument('--max_abs_reward', type=float, default=None,
                      help="the largest |reward| a request may carry, past which the "
                      "server refuses it by name (default: the env's bound, 1e6)")
  parser.add_argument('--checkpoint_interval_s', type=float, default=60.0,
                      help='checkpoint period; a rerun with the same --logdir resumes '
                      '(0: no checkpoints)')
  parser.add_argument('--checkpoint_rounds', type=int, default=50,
                      help='with --reproducible: checkpoint every this many rounds '
                      'instead, envs included, so that a resume is exact')


def parse_overrides(items: List[str]) -> Dict[str, Any]:
  """`['torso=impala_resnet', 'hidden_sizes=(64, 64)']` -> config overrides."""
  overrides = {}
  for item in items:
    key, sep, text = item.partition('=')
    if not sep or not key.strip():
      raise ValueError(f'expected FIELD=VALUE, got {item!r}')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # a bare string such as impala_resnet
    overrides[key.strip()] = value
  return overrides


def agent_overrides(args: argparse.Namespace) -> Dict[str, Any]:
  """`--agent_config`, and `--seed` as the agent config's `seed` (its action sampling
  and minibatch order) unless `--agent_config seed=N` gives one: a run's seed then
  seeds the agent as well as the envs (before, every `--seed` ran the agent's seed 0)."""
  overrides = parse_overrides(args.agent_config)
  if 'seed' not in overrides and any(
      f.name == 'seed' for f in dataclasses.fields(agents.config_class(args.agent))):
    overrides['seed'] = args.seed
  return overrides


def agent_arguments(args: argparse.Namespace, env_config: Dict[str, Any]) -> Dict[str, Any]:
  """What the registry's `make_config` / `make_builder` get besides agent and env: the
  program's size, the task the training envs' full options name, the env-step budget
  and the agent overrides -- one place, so the launcher and `resolved_run` agree."""
  return dict(num_train_envs=args.num_actors * args.envs_per_actor,
              task=task_of(env_config), budget_env_steps=args.max_env_steps or None,
              **agent_overrides(args))


def env_options(args: argparse.Namespace) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """(training envs', evaluator envs') factory options: game, level, scenario and
  `--env_config`; the training envs also get the agent's training-env defaults, which
  `--env_config` overrides; the evaluator's never get a training-only option."""
  given = {k: v for k, v in (('level', args.level), ('game', args.game),
                             ('scenario', args.scenario)) if v}
  try:
    given.update(parse_overrides(args.env_config))
  except ValueError as e:
    raise ProgramArgsError(f'bad --env_config: {e}') from e
  defaults = agents.train_env_config(args.agent, args.env)
  train = {**given, **{k: v for k, v in defaults.items() if k not in given}}
  training_only = set(defaults)
  training_only.update(training_only_options(args.env))
  evaluation = {k: v for k, v in given.items() if k not in training_only}
  return train, evaluation


def task_of(env_config: Dict[str, Any]) -> str | None:
  """The task an env's full options name (MuJoCo level, Atari game, Football
  scenario; the env's default when no flag gave one), for the registry's per-task
  defaults; None for envs with one task."""
  for key in ('level', 'game', 'scenario'):
    if env_config.get(key):
      return str(env_config[key])
  return None


def resolved_run(args: argparse.Namespace) -> Dict[str, Any]:
  """What the flags resolve to, JSON-ready: the agent's config dataclass as a dict
  (its defaults, the registry's, the fit to the program's size, `--agent_config`) and
  the training envs' full options (`envs.registry.factory_options`). Creates no env."""
  train, _ = env_options(args)
  try:
    env_config = factory_options(args.env, **train)
    config = agents.make_config(args.agent, args.env, **agent_arguments(args, env_config))
  except (TypeError, ValueError) as e:
    raise ProgramArgsError(f'cannot resolve {args.env} {args.agent}: {e}') from e
  return json.loads(json.dumps({'agent_config_full': dataclasses.asdict(config),
                                'env_config_full': env_config}))


def make_program_inputs(args: argparse.Namespace, logdir: str,
                        accelerator: str | None = None
                        ) -> Tuple[Any, envs.EnvSpec, Any, ProgramConfig]:
  """(env factory, env spec, builder, config) of the program the flags describe.

  Creates one env here to learn its spec. Raises `ProgramArgsError` naming the flag.
  """
  env_args, eval_env_args = env_options(args)  # what the envs are
  engine = {} if args.env_engine == 'python' else {'engine': args.env_engine}
  try:  # the factory carries the engine to the actors
    factory = envs.make_factory(args.env, **env_args, **engine)
    if eval_env_args != env_args:
      factory = EnvFactories(factory, envs.make_factory(args.env, **eval_env_args, **engine))
  except ValueError as e:  # e.g. --env_engine vector_sync for a non-Atari env
    raise ProgramArgsError(str(e)) from e
  try:
    probe = factory(args.seed)
  except (ImportError, TypeError, ValueError) as e:  # a module to build; bad --env_config
    raise ProgramArgsError(f'cannot create {args.env!r}: {e}') from e
  spec = envs.env_spec_of(probe)
  env_not_exact = getattr(probe, 'not_exact_because', None)  # config.env_not_exact
  if hasattr(probe, 'close'):
    probe.close()
  try:
    builder = agents.make_builder(
        args.agent, args.env,
        **agent_arguments(args, factory_options(args.env, **env_args)))
  except (TypeError, ValueError) as e:
    raise ProgramArgsError(f'bad --agent_config: {e}') from e
  try:
    builder.check_spec(spec)
  except ValueError as e:
    raise ProgramArgsError(f'{args.agent} on {args.env}: {e}') from e
  config = ProgramConfig(
      num_actors=args.num_actors, envs_per_actor=args.envs_per_actor,
      num_eval_envs=args.num_eval_envs, eval_interval_s=args.eval_interval_s,
      eval_episodes=args.eval_episodes, inference_timeout_ms=args.inference_timeout_ms,
      inference_batch_envs=args.inference_batch_envs or ProgramConfig.inference_batch_envs,
      max_seconds=args.max_seconds or None,
      # `--max_seconds 0` is "no limit", not "no flag": no default then either.
      default_max_seconds=None if args.max_seconds == 0 else getattr(
          args, 'default_max_seconds', ProgramConfig.default_max_seconds),
      max_learner_steps=args.max_learner_steps or None,
      max_env_steps=args.max_env_steps or None, target_return=args.target_return,
      target_on=args.target_on,
      logdir=logdir, progress_interval_s=args.progress_interval_s, seed=args.seed,
      reproducible=getattr(args, 'reproducible', False),
      reproducible_lag=getattr(args, 'reproducible_lag', 0),
      reproducible_threads=getattr(args, 'reproducible_threads', 2),
      env_not_exact=env_not_exact,
      checkpoint_interval_s=args.checkpoint_interval_s or None,
      checkpoint_rounds=getattr(args, 'checkpoint_rounds', 50),
      standby_restarts=args.standby_restarts,
      learner_step_delay_s=args.learner_step_delay_s, inference=args.inference,
      transport=args.transport, inference_devices=args.inference_devices,
      learner_devices=args.learner_devices, logical_cpus=args.logical_cpus,
      policy_copy=args.policy_copy,
      variable_update_period=args.variable_update_period, train=not args.acting_only,
      acting_nice=args.acting_nice, accelerator=accelerator, env_name=args.env,
      env_step_timeout_s=args.env_step_timeout_s or None,
      max_abs_reward=args.max_abs_reward,
      env_args=env_args,
      env_factory_identity=identity.factory_identity(factory_for(factory, Mode.TRAIN)),
      allow_config_change=tuple(
          f.strip() for item in getattr(args, 'allow_config_change', []) for f in
          item.split(',') if f.strip()))
  try:
    config.validate(builder, factory)
  except ValueError as e:
    raise ProgramArgsError(str(e)) from e
  if config.checkpoint_interval_s and identity.is_local(logdir):
    try:  # the refusal before anything starts; the central node checks again
      identity.check_resume(os.path.join(logdir, identity.CHECKPOINTS),
                            identity.run_identity(builder, spec, config),
                            config.allow_config_change)
    except identity.RunConfigMismatchError as e:
      raise ProgramArgsError(str(e)) from e
  return factory, spec, builder, config
