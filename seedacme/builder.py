"""The agent contract: what an agent gives the SEED machinery (after Acme's builders).

Acme's `ActorLearnerBuilder` has `make_replay_tables`, `make_dataset_iterator`,
`make_adder`, `make_actor`, `make_learner`. With SEED's split the actors hold no agent
code at all, so what Acme's actor and adder did moves to the central node:

    make_replay_tables      -> the Reverb tables (replay node)
    make_networks           -> the only copy of the variables (central node)
    make_policy             -> batched server-side action selection (inference server)
    make_trajectory_sink    -> how served steps become Reverb items (unrolls, sequences)
    make_learner            -> dataset from Reverb -> loss -> SGD step

`seedacme.nodes.program.make_program` assembles any builder into a Launchpad program and
knows nothing about V-trace or R2D2. The contract's parts live with their roles
(`Learner` in `seedacme.learner.base`, `TrajectorySink` in `seedacme.trajectories.sink`,
`ServerPolicy` in `seedacme.serving.policy`); this module names them together.
"""

import abc
from typing import Any, Dict, List, Tuple

from seedacme.learner.base import Learner
from seedacme.run.schedule import RoundSchedule
from seedacme.serving.policy import ServerPolicy
from seedacme.trajectories.sink import ReverbSequenceSink, TrajectorySink
from seedacme.types import EnvSpec


class SeedBuilder(abc.ABC):
  """Everything agent-specific about a SEED program."""

  name: str = 'agent'
  # Whether the agent serves continuous (bounded float) actions; every agent serves
  # discrete ones. `check_spec` refuses the others at start-up, never mid-run.
  continuous_actions: bool = False
  # Whether the learner runs data-parallel over several devices
  # (`seedacme.learner.replicas`); others refuse --learner_devices with more than one.
  multi_device_learner: bool = False

  def check_spec(self, spec: EnvSpec) -> None:
    """Raises ValueError, naming the agent and the env's actions, if the agent cannot
    serve `spec` (called by `make_program` and the launchers before anything starts)."""
    if spec.continuous and not self.continuous_actions:
      raise ValueError(f'agent {self.name!r} cannot serve this env: it has '
                       f'{spec.describe_actions()}, and {self.name} acts on discrete '
                       'actions only (ppo and vtrace serve continuous actions)')

  @property
  def replay_checkpoint_interval_s(self) -> float | None:
    """How often the replay node checkpoints its tables (None: never).

    A restarted replay node loads the latest of these checkpoints. Worth it for a
    replay buffer that took long to fill (R2D2); a V-trace queue refills in seconds
    with fresher unrolls, so the default is None.
    """
    return None

  def replay_capacity(self) -> Tuple[int, int]:
    """(items, steps per item) the replay holds when full, to size its machine (Vertex)."""
    raise NotImplementedError(f'{type(self).__name__} does not say its replay capacity')

  @abc.abstractmethod
  def make_replay_tables(self, spec: EnvSpec) -> List[Any]:
    """Reverb tables, built inside the replay node."""

  @abc.abstractmethod
  def make_networks(self, spec: EnvSpec) -> Any:
    """Networks with their variables created (central node)."""

  @abc.abstractmethod
  def make_policy(self, networks: Any, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> ServerPolicy:
    """The batched policy the inference server runs; it holds the state of global env
    ids 0..num_envs-1, of which 0..num_train_envs-1 are training envs."""

  @abc.abstractmethod
  def make_trajectory_sink(self, replay_client: Any, num_envs: int,
                           spec: EnvSpec) -> TrajectorySink:
    """How served steps become Reverb items."""

  @abc.abstractmethod
  def make_learner(self, networks: Any, replay_client: Any, spec: EnvSpec) -> Learner:
    """The learner, sharing `networks` (and so the variables) with the policy."""

  def policy_network(self, networks: Any) -> Any:
    """The network the policy acts with (exported as a SavedModel)."""
    return networks

  def round_schedule(self, num_train_envs: int, lag: int = 0) -> RoundSchedule:
    """The agent's reproducible schedule with `num_train_envs` training envs, acting
    `lag` rounds behind (`seedacme.run.schedule`, `ProgramConfig.reproducible`); raises
    ValueError saying why there is none."""
    raise ValueError(
        f'agent {self.name!r} has no reproducible schedule: not yet: issue 63 Deliver 2 '
        '(replay-ratio schedules for the off-policy agents)')


class UnrollQueueBuilder(SeedBuilder):
  """What the on-policy agents (V-trace, PPO) share: a Reverb queue of unrolls.

  Each item is one env's T + 1 consecutive steps (T transitions plus the bootstrap
  step; consecutive unrolls overlap by one step), with what the policy stored per step
  (`extras_signature`) and, for recurrent networks, the state the unroll started
  from. A full queue blocks inference: that bounds the policy lag and the memory.
  Subclasses give `_network(spec)`, `extras_signature` (with the env's id,
  `env_id`, per step), `make_policy` and `make_learner` (its batches from
  `make_batches`); their config has `unroll_length`, `queue_size` and `batch_size`.

  In a reproducible run the central node sets `schedule` (`round_schedule`) before
  `make_learner`: the learner then takes each round's N unrolls at once and trains on
  them in env-id order, B at a time (`RoundBatches`).
  """

  table = 'unrolls'
  # Items the trajectory writer may hold while the queue is full (its own bound).
  writer_pending = 64
  schedule: RoundSchedule | None = None  # reproducible runs: set by the central node

  def __init__(self, config: Any):
    self.config = config

  def round_schedule(self, num_train_envs: int, lag: int = 0) -> RoundSchedule:
    """One unroll per env per round, `batch_size` of them per learner step."""
    return RoundSchedule(num_train_envs, self.config.unroll_length, self.config.batch_size,
                         lag=lag)

  def make_batches(self, replay_client: Any, **reverb_options: Any) -> Any:
    """The learner's batches of `config.batch_size` unrolls from the queue
    (`ReverbBatches` with `reverb_options`), or, with a `schedule`, whole rounds
    in env-id order (`RoundBatches`: Reverb's order and prefetch do not matter)."""
    from seedacme.trajectories import datasets  # pylint: disable=g-import-not-at-top
    if self.schedule is None:
      return datasets.ReverbBatches(replay_client.server_address, self.table,
                                    self.config.batch_size, **reverb_options)
    if self.schedule.batch_size != self.config.batch_size:
      raise ValueError(f'{self.schedule} does not fit batch_size={self.config.batch_size}')
    n = self.schedule.num_envs
    return datasets.RoundBatches(
        datasets.ReverbBatches(replay_client.server_address, self.table, n, prefetch=0,
                               max_in_flight=n, rate_limiter_timeout_ms=-1),
        self.schedule.batch_size)

  @property
  def unroll_steps(self) -> int:
    """Steps stored per unroll: T transitions plus the bootstrap step."""
    return self.config.unroll_length + 1

  def replay_capacity(self) -> Tuple[int, int]:
    return self.config.queue_size, self.unroll_steps

  def _network(self, spec: EnvSpec) -> Any:
    raise NotImplementedError

  def extras_signature(self, spec: EnvSpec, network: Any) -> Dict[str, Any]:
    """Per-step specs of what the policy stores besides the action (no time axis)."""
    raise NotImplementedError

  def item_signature(self, spec: EnvSpec) -> Dict[str, Any]:
    """`tf.TensorSpec`s of one Reverb item (an unroll)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tree  # pylint: disable=g-import-not-at-top
    n = self.unroll_steps
    network = self._network(spec)
    signature = {
        'observation': tf.TensorSpec((n,) + spec.observation_shape, tf.as_dtype(spec.dtype)),
        'reward': tf.TensorSpec((n,), tf.float32),
        'discount': tf.TensorSpec((n,), tf.float32),
        'step_type': tf.TensorSpec((n,), tf.int8),
        'action': tf.TensorSpec((n,) + tuple(spec.action_shape),
                                tf.as_dtype(spec.action_dtype)),
    }
    for name, s in self.extras_signature(spec, network).items():
      signature[name] = tf.TensorSpec((n,) + tuple(s.shape), s.dtype)
    state = network.initial_state(1)
    if tree.flatten(state):
      signature['initial_state'] = tree.map_structure(
          lambda x: tf.TensorSpec(x.shape[1:], x.dtype), state)
    return signature

  def make_replay_tables(self, spec: EnvSpec) -> List[Any]:
    import reverb  # pylint: disable=g-import-not-at-top
    return [reverb.Table.queue(self.table, max_size=self.config.queue_size,
                               signature=self.item_signature(spec))]

  def make_networks(self, spec: EnvSpec) -> Any:
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    network = self._network(spec)
    dummy = np.zeros((1,) + spec.observation_shape, spec.dtype)
    network(tf.constant(dummy), network.initial_state(1))  # Create the variables now.
    return network

  @staticmethod
  def unroll_items(sequences: Any) -> List[Tuple[float, Dict[str, Any]]]:
    """Unrolls as Reverb items; a queue ignores priorities, so all are 1."""
    import tree  # pylint: disable=g-import-not-at-top
    state_leaves = tree.flatten(sequences['state'])
    items = []
    for i in range(sequences['action'].shape[0]):
      item = {k: sequences[k][i] for k in ('observation', 'reward', 'discount',
                                           'step_type', 'action')}
      item.update({k: v[i] for k, v in sequences['extras'].items()})
      if state_leaves:
        item['initial_state'] = tree.map_structure(lambda x, i=i: x[i, 0], sequences['state'])
      items.append((1.0, item))
    return items

  def make_trajectory_sink(self, replay_client, num_envs: int, spec: EnvSpec):
    del spec
    return ReverbSequenceSink(replay_client, self.table, num_envs, length=self.unroll_steps,
                              period=self.config.unroll_length, to_items=self.unroll_items,
                              max_pending=self.writer_pending)
