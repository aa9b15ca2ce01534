"""Assembles any agent (a `SeedBuilder`) into a Launchpad program.

    replay     Reverb tables from the builder
    learner    `CentralNode`: inference service (Courier) + learner thread
    actor x N  `EnvActor`: env-only, K envs each (inference='actor': each with its
               own policy copy, `seedacme.actor_side_inference`)
    evaluator  `EnvActor(greedy=True)` through the same inference service

There is no counter node: progress is counted on the central node (env steps arrive
with every inference request), and an Acme `Counter` nobody read cost a process locally
and a replica on Vertex. Every node is supervised (`seedacme.supervisor`) when
`config.supervise` is set, the replay node included (`ReplayNode`).

Nothing here knows which agent it runs or how the program is launched (`launchers/`).
"""

import functools
import shutil
import tempfile
from typing import Callable

import cloudpickle
import launchpad as lp
from launchpad.nodes.python import local_multi_processing

from seedacme import supervisor
from seedacme.actor import EnvActor, run_actor
from seedacme.actor_side_inference import run_actor_with_inference
from seedacme.builder import SeedBuilder
from seedacme.central import CentralNode
from seedacme.config import ProgramConfig
from seedacme.envs.registry import EnvFactory, EnvSpec

# Threads each env-only actor process may use for numpy/BLAS: K envs must not fight
# over the cores the learner needs.
ACTOR_ENV = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
             'CUDA_VISIBLE_DEVICES': ''}


class ReplayNode(lp.ReverbNode):
  """Launchpad's Reverb node, supervised, checkpointed, and outliving its clients briefly.

  * Supervised (`supervise=True`): the Reverb server runs in a child process
    (`supervisor.serve_replay`) that is restarted on the same port when it dies; the
    central node's writers and the learner's dataset reconnect by themselves.
  * Checkpointed (`checkpoint_interval_s`): the child writes a Reverb checkpoint this
    often into a directory owned by this (supervisor) process, and a restarted child
    loads the latest one -- R2D2's prioritized replay survives a crash. The directory
    is removed when the node stops: a resumed *program* still starts with empty tables.
  * Grace period: Launchpad signals every node at once. If the Reverb server vanished
    first, a learner waiting inside a Reverb sample would block on a dead server
    instead of timing out normally and seeing the stop signal.
  """

  def __init__(self, priority_tables_fn, grace_s: float = 2.0, supervise: bool = True,
               checkpoint_interval_s: float | None = None, standby: bool = False):
    super().__init__(priority_tables_fn)
    self._grace_s = grace_s
    self._supervise = supervise
    self._checkpoint_interval_s = checkpoint_interval_s
    self._standby = standby  # a standby child with Reverb imported (seedacme.supervisor)

  def run(self):
    # Reverb's default checkpointer makes a temp dir per server and never removes it.
    checkpoint_dir = tempfile.mkdtemp(prefix='seedacme_reverb_')
    port = lp.get_port_from_address(self._address.resolve())
    kwargs = dict(port=port, tables_fn=self._priority_tables_fn,
                  checkpoint_dir=checkpoint_dir, grace_s=self._grace_s,
                  checkpoint_interval_s=self._checkpoint_interval_s)
    try:
      if self._supervise:
        supervisor.Supervisor(supervisor.serve_replay, kwargs, 'replay',
                              standby_imports=('reverb',) if self._standby else ()).run()
      else:
        supervisor.serve_replay(stop_event=None, **kwargs)
    finally:
      shutil.rmtree(checkpoint_dir, ignore_errors=True)
    if self._supervise:
      supervisor.exit_node()  # the server is stopped and its files gone (see exit_node)


def make_program(builder: SeedBuilder, env_factory: EnvFactory, spec: EnvSpec,
                 config: ProgramConfig,
                 stop_program: Callable[[], None] | None = None,
                 name: str = 'seedacme') -> lp.Program:
  """Builds the Launchpad program of a SEED agent.

  Args:
    builder: the agent.
    env_factory: picklable `factory(seed) -> dm_env.Environment`.
    spec: the env's spec (observation shape/dtype, number of actions).
    config: sizes, batching, budget, logdir.
    stop_program: called by the central node when the budget is reached
      (`lp.make_program_stopper(launch_type)`, created in the launching process).
  """
  config.validate()
  program = lp.Program(name)
  with program.group('replay'):
    replay_node = ReplayNode(functools.partial(builder.make_replay_tables, spec),
                             supervise=config.supervise,
                             checkpoint_interval_s=builder.replay_checkpoint_interval_s,
                             standby=config.standby_restarts)
    replay = program.add_node(replay_node)
  courier_kwargs = {'thread_pool_size': config.num_actors + 16}
  central_args = dict(builder=builder, spec=spec, config=config, stop_program=stop_program)
  with program.group('learner'):
    if config.supervise:
      # The replay node's address, not its handle: the handle's module imports Reverb
      # and TensorFlow, which the supervisor process has no use for.
      node = supervisor.SupervisedCentralNode(
          payload=cloudpickle.dumps(central_args), replay_address=replay_node.reverb_address,
          courier_kwargs=courier_kwargs, standby=config.standby_restarts)
    else:
      node = lp.CourierNode(CentralNode, replay=replay,
                            courier_kwargs=courier_kwargs, **central_args)
    learner = program.add_node(node)

  def actor_node(name: str, **kwargs):
    kwargs.update(env_factory=env_factory)
    if config.inference == 'actor':
      # Acme's pattern: the actor runs its own policy copy (seedacme.actor_side_inference).
      kwargs.update(central=learner, replay_address=replay_node.reverb_address,
                    payload=cloudpickle.dumps((builder, spec, config)))
      target = run_actor_with_inference
    else:
      kwargs.update(inference=learner)
      target = run_actor
    if config.supervise:
      return lp.PyNode(supervisor.run_supervised, target=target, name=name, **kwargs)
    if config.inference == 'actor':
      return lp.PyNode(target, **kwargs)
    return lp.PyClassNode(EnvActor, **kwargs)

  with program.group('actor'):
    for i in range(config.num_actors):
      program.add_node(actor_node(
          f'actor/{i}', actor_id=i, num_envs=config.envs_per_actor,
          first_env_id=i * config.envs_per_actor, seed=config.seed + 1000 * i))
  if config.num_eval_envs:
    with program.group('evaluator'):
      program.add_node(actor_node(
          'evaluator/0', actor_id=0, num_envs=config.num_eval_envs,
          first_env_id=config.num_train_envs, greedy=True, seed=config.seed + 10**6,
          eval_interval_s=config.eval_interval_s, eval_episodes=config.eval_episodes))
  return program


def local_resources(program: lp.Program) -> dict:
  """Per-group process settings for `local_mp` launches (thread limits for actors)."""
  return {group: local_multi_processing.PythonProcess(env=dict(ACTOR_ENV))
          for group in program.groups if group in ('actor', 'evaluator')}
