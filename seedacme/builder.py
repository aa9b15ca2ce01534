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
from typing import Any, List, Tuple

from seedacme.learner.base import Learner
from seedacme.serving.policy import ServerPolicy
from seedacme.trajectories.sink import TrajectorySink
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
