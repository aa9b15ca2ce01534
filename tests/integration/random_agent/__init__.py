"""A third agent, as small as one can be: uniform random actions and a learner that
only counts. It shows what adding an agent takes -- this package (config dataclass and
`SeedBuilder`) and the one `register_agent` line at the bottom -- and
tests/integration/test_third_agent.py runs it through the real program.

Importing this module registers the agent, and asks cloudpickle to send its classes by
value: the program's node processes then need not import the test tree.
"""

import dataclasses
from typing import Any, Dict, List, Tuple

import cloudpickle
import numpy as np

from seedacme import builder as builder_lib
from seedacme.agents import registry
from seedacme.types import EnvSpec
from seedacme.serving.policy import PolicyStep, StatelessPolicy


@dataclasses.dataclass(frozen=True)
class RandomConfig:
  seed: int = 0
  learner_step_s: float = 0.05  # what one (empty) learner step takes


class RandomPolicy(StatelessPolicy):
  """Uniform random actions, greedy or not."""

  def __init__(self, num_envs: int, num_actions: int, seed: int):
    super().__init__(num_envs)
    self._num_actions = num_actions
    self._rng = np.random.default_rng(seed)

  def act(self, observation, eval_mask, env_ids) -> PolicyStep:
    del observation, eval_mask
    return PolicyStep(self._rng.integers(self._num_actions, size=len(env_ids),
                                         dtype=np.int32), {}, ())


class CountingSink(builder_lib.TrajectorySink):
  """Counts the training steps it is given; writes nothing."""

  def __init__(self):
    self.steps = 0

  def add(self, env_ids, step) -> None:
    self.steps += len(env_ids)

  def reset(self, env_ids) -> None:
    del env_ids

  def stats(self) -> Dict[str, float]:
    return {'steps_seen': self.steps}

  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    return True


class CountingLearner(builder_lib.Learner):
  """One 'step' per `learner_step_s` once the sink has seen data (before that, like a
  learner whose dataset is empty, no step); its counter is checkpointed."""

  def __init__(self, counter, step_s: float, sink: CountingSink):
    self._counter = counter
    self._step_s = step_s
    self._sink = sink

  def step(self) -> Dict[str, float] | None:
    import time  # pylint: disable=g-import-not-at-top
    time.sleep(self._step_s)
    if not self._sink.steps:
      return None  # no data yet: actors still starting
    self._counter.assign_add(1)
    return {'updates': float(self._counter.numpy())}

  def checkpoint_state(self) -> Dict[str, Any]:
    return {'updates': self._counter}


def _network(num_actions: int):
  """Uniform logits as a TF module, so the SavedModel export has something to save."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class UniformNetwork(tf.Module):

    def __init__(self):
      super().__init__(name='uniform')
      self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)

    def __call__(self, observation, state):
      return tf.zeros([tf.shape(observation)[0], num_actions]), state

    def initial_state(self, batch_size):
      return tf.zeros([batch_size, 1])

  return UniformNetwork()


class RandomBuilder(builder_lib.SeedBuilder):
  """Wires the random agent into a SEED program."""

  name = 'random'
  table = 'random_unused'

  def __init__(self, config: RandomConfig = RandomConfig()):
    self.config = config

  def replay_capacity(self) -> Tuple[int, int]:
    return 1, 1

  def make_replay_tables(self, spec: EnvSpec) -> List[Any]:
    import reverb  # pylint: disable=g-import-not-at-top
    return [reverb.Table.queue(self.table, max_size=1)]

  def make_networks(self, spec: EnvSpec):
    return _network(spec.num_actions)

  def make_policy(self, networks, spec: EnvSpec, num_train_envs: int,
                  num_envs: int) -> StatelessPolicy:
    return RandomPolicy(num_envs, spec.num_actions, self.config.seed)

  def _sink(self) -> CountingSink:
    """The one sink of this central node, which the learner also reads."""
    if getattr(self, '_counting_sink', None) is None:
      self._counting_sink = CountingSink()
    return self._counting_sink

  def make_trajectory_sink(self, replay_client, num_envs: int, spec: EnvSpec):
    return self._sink()

  def make_learner(self, networks, replay_client, spec: EnvSpec):
    return CountingLearner(networks.updates, self.config.learner_step_s, self._sink())


cloudpickle.register_pickle_by_value(__import__(__name__, fromlist=['_']))

# The registration line.
registry.register_agent(registry.AgentEntry('random', RandomBuilder, RandomConfig))
