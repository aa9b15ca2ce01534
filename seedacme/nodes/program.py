"""Assembles any agent (a `SeedBuilder`) into a Launchpad program.

    replay     Reverb tables from the builder
    learner    `CentralNode`: inference service (Courier) + learner thread
    actor x N  `EnvActor`: env-only, K envs each (inference='actor': each with its
               own policy copy, `seedacme.actor.actor_side`)
    evaluator  `EnvActor(mode=Mode.EVAL)` through the same inference service

There is no counter node: progress is counted on the central node (env steps arrive
with every inference request), and an Acme `Counter` nobody read cost a process locally
and a replica on Vertex. Every node is supervised (`seedacme.runtime.supervisor`) when
`config.supervise` is set, the replay node included (`ReplayNode`).

Nothing here knows which agent it runs or how the program is launched (`launchers/`).
"""

import dataclasses
import functools
import os
from typing import Callable

import cloudpickle
import launchpad as lp
from launchpad.nodes.python import local_multi_processing

from seedacme.actor.actor_side import run_actor_with_inference
from seedacme.actor.env_actor import EnvActor, run_actor
from seedacme.builder import SeedBuilder
from seedacme.config import ProgramConfig
from seedacme.nodes.central_process import SupervisedCentralNode
from seedacme.nodes.replay import ReplayNode
from seedacme.runtime import machine_pins
from seedacme.run import identity
from seedacme.run.schedule import eval_env_seed, train_env_seed
from seedacme.runtime.supervisor import run_supervised
from seedacme.types import EnvFactories, EnvFactory, EnvSpec, Mode, factory_for

# Threads each env-only actor process may use for numpy/BLAS: K envs must not fight
# over the cores the learner needs. Set in the environment of the process that does
# the work: a supervised actor's child, whatever launcher started its node (local,
# cluster, Vertex: there the node process imported numpy before any node code ran),
# and, for local launches, the node process too (`local_resources`).
ACTOR_ENV = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
             'CUDA_VISIBLE_DEVICES': ''}


def replay_checkpoint_dir(config: ProgramConfig,
                          replay_interval_s: float | None) -> str | None:
  """Where the replay node keeps its checkpoints across program runs: `<logdir>/replay`
  when the run checkpoints (a rerun on the logdir resumes learner and replay), else
  None (a temporary directory, for crash restarts within the run only). A logdir that
  is a URL (gs://...) keeps no replay: Reverb checkpoints to local files."""
  if replay_interval_s is None or not config.checkpoint_interval_s or '://' in config.logdir:
    return None
  return os.path.join(config.logdir, 'replay')


def make_program(builder: SeedBuilder, env_factory: EnvFactory | EnvFactories, spec: EnvSpec,
                 config: ProgramConfig,
                 stop_program: Callable[[], None] | None = None,
                 name: str = 'seedacme') -> lp.Program:
  """Builds the Launchpad program of a SEED agent.

  Args:
    builder: the agent.
    env_factory: picklable `factory(seed) -> dm_env.Environment`, or `EnvFactories`
      (the actors' envs from one, the evaluator's from the other).
    spec: the env's spec (observation shape/dtype, number of actions).
    config: sizes, batching, budget, logdir (its `env_factory_identity` is set here,
      from `env_factory`).
    stop_program: called by the central node when the budget is reached
      (`lp.make_program_stopper(launch_type)`, created in the launching process).
  """
  config.validate(builder, env_factory)
  builder.check_spec(spec)
  if config.reproducible:
    # Before any node process starts: they inherit it (numpy and oneDNN read it when
    # they load), so the run computes as on an AVX2 CPU wherever it runs.
    machine_pins.pin_environ()
  # The env a resume compares (seedacme.run.identity): the factory's own, so a
  # launcher's program and one composed in Python record the same kind.
  config = dataclasses.replace(config, env_factory_identity=identity.factory_identity(
      factory_for(env_factory, Mode.TRAIN)))
  program = lp.Program(name)
  with program.group('replay'):
    replay_interval = builder.replay_checkpoint_interval_s
    replay_node = ReplayNode(functools.partial(builder.make_replay_tables, spec),
                             supervise=config.supervise,
                             checkpoint_interval_s=replay_interval,
                             standby=config.standby_restarts,
                             checkpoint_dir=replay_checkpoint_dir(config, replay_interval))
    replay = program.add_node(replay_node)
  courier_kwargs = {'thread_pool_size': config.num_actors + 16}
  central_args = dict(builder=builder, spec=spec, config=config, stop_program=stop_program)
  with program.group('learner'):
    if config.supervise:
      # The replay node's address, not its handle: the handle's module imports Reverb
      # and TensorFlow, which the supervisor process has no use for.
      node = SupervisedCentralNode(
          payload=cloudpickle.dumps(central_args), replay_address=replay_node.reverb_address,
          courier_kwargs=courier_kwargs, standby=config.standby_restarts)
    else:
      # Imported here: the central node's module imports TensorFlow (5 s here, 10-12 s
      # at load 3), which a launcher of the default, supervised program never needs.
      from seedacme.nodes.central import CentralNode  # pylint: disable=g-import-not-at-top
      node = lp.CourierNode(CentralNode, replay=replay,
                            courier_kwargs=courier_kwargs, **central_args)
    learner = program.add_node(node)

  def actor_node(name: str, mode: Mode = Mode.TRAIN, **kwargs):
    kwargs.update(env_factory=factory_for(env_factory, mode), mode=mode,
                  nice=config.acting_nice, env_step_timeout_s=config.env_step_timeout_s)
    if config.inference == 'actor':
      # Acme's pattern: the actor runs its own policy copy (seedacme.actor.actor_side).
      kwargs.update(central=learner, replay_address=replay_node.reverb_address,
                    payload=cloudpickle.dumps((builder, spec, config)))
      target = run_actor_with_inference
    else:
      kwargs.update(inference=learner, transport=config.transport)
      target = run_actor
    if config.supervise:
      return lp.PyNode(run_supervised, target=target, name=name, child_env=ACTOR_ENV,
                       **kwargs)
    if config.inference == 'actor':
      return lp.PyNode(target, **kwargs)
    return lp.PyClassNode(EnvActor, **kwargs)

  # Env e's seed is the run seed's block + e on any split (engines add the slot);
  # the evaluator's envs have a range of their own (seedacme.run.schedule).
  # A reproducible run's round checkpoints hold the envs: actors hand them in at each
  # checkpoint round and take them back on an exact resume (seedacme.run.resume).
  snapshots = {}
  if config.reproducible and config.checkpoint_interval_s is not None and \
      config.inference == 'central':
    calls_per_round = builder.round_schedule(config.num_train_envs).unroll_length
    snapshots = {'round_snapshots': (calls_per_round, config.checkpoint_rounds)}
  with program.group('actor'):
    for i in range(config.num_actors):
      first = i * config.envs_per_actor
      program.add_node(actor_node(
          f'actor/{i}', actor_id=i, num_envs=config.envs_per_actor,
          first_env_id=first, seed=train_env_seed(config.seed, first), **snapshots))
  if config.num_eval_envs:
    with program.group('evaluator'):
      program.add_node(actor_node(
          'evaluator/0', actor_id=0, num_envs=config.num_eval_envs,
          first_env_id=config.num_train_envs, mode=Mode.EVAL,
          seed=eval_env_seed(config.seed, 0),
          eval_interval_s=config.eval_interval_s, eval_episodes=config.eval_episodes,
          **snapshots))
  return program


def local_resources(program: lp.Program) -> dict:
  """Per-group process settings for `local_mp` launches (thread limits for actors)."""
  return {group: local_multi_processing.PythonProcess(env=dict(ACTOR_ENV))
          for group in program.groups if group in ('actor', 'evaluator')}
