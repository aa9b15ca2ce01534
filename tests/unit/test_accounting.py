"""The acting account: episodes tracked per env, and the order the server relies on.

`InferenceServer` hands `EpisodeTracker.observe` a batch of env ids in batch order and
then splits the ended episodes by each env's `Mode` with a mask over the batch's LAST
steps: that is only right if `observe` lists ended episodes in the order of the ids
it was given (not sorted by id). These tests state that contract.
"""

import numpy as np

from seedacme.run.accounting import ActingLog, EpisodeTracker
from seedacme.types import FIRST, LAST, MID, Mode


def test_observe_returns_ended_episodes_in_the_order_of_the_given_ids():
  tracker = EpisodeTracker(10)
  ids = np.array([7, 2, 9, 0])  # unsorted, as a batch joined from several actors
  tracker.observe(ids, np.full(4, FIRST), np.zeros(4))
  tracker.observe(ids, np.full(4, MID), np.array([1.0, 2.0, 3.0, 4.0]))
  ended = tracker.observe(ids, np.array([LAST, MID, LAST, LAST]),
                          np.array([10.0, 0.0, 30.0, 40.0]))
  assert ended.ids.tolist() == [7, 9, 0]  # batch order, not [0, 7, 9]
  assert ended.returns.tolist() == [11.0, 33.0, 44.0]
  assert ended.lengths.tolist() == [2, 2, 2]


def test_forget_starts_an_env_over_and_first_resets_it():
  tracker = EpisodeTracker(2)
  tracker.observe(np.array([0, 1]), np.array([MID, MID]), np.array([5.0, 5.0]))
  tracker.forget(np.array([1]))  # its actor restarted
  ended = tracker.observe(np.array([0, 1]), np.array([LAST, LAST]), np.array([1.0, 1.0]))
  assert ended.returns.tolist() == [6.0, 1.0]


def test_the_server_splits_episodes_by_mode_in_batch_order():
  """What `InferenceServer` does with the tracker's output, on a mixed batch."""
  from seedacme.serving.server import InferenceServer  # pylint: disable=g-import-not-at-top
  from seedacme.serving.policy import PolicyStep, StatelessPolicy  # pylint: disable=g-import-not-at-top
  from seedacme.types import EnvSpec  # pylint: disable=g-import-not-at-top
  from seedacme.wire.protocol import make_request  # pylint: disable=g-import-not-at-top

  class Zero(StatelessPolicy):
    def act(self, observation, eval_mask, env_ids):
      return PolicyStep(np.zeros(len(observation), np.int32), {}, ())

  log = ActingLog()
  server = InferenceServer(Zero(8), EnvSpec((1,), 'float32', 2), 8, None,
                           max_batch_envs=1, batch_timeout_s=0.0, acting=log)
  try:
    def step(ids, mode, step_type, reward):
      k = len(ids)
      server.step(make_request(ids, np.ones(k), np.zeros((k, 1), np.float32),
                               np.full(k, reward), np.ones(k), np.full(k, step_type), mode))
    # Evaluation envs 6, 5 and training envs 3, 1: ids descending inside each request.
    for step_type, reward in ((FIRST, 0.0), (LAST, 2.0)):
      step([6, 5], Mode.EVAL, step_type, 10 * reward)
      step([3, 1], Mode.TRAIN, step_type, reward)
  finally:
    server.close()
  assert log.summary(Mode.TRAIN)['episodes'] == 2
  assert log.summary(Mode.TRAIN)['average_return'] == 2.0
  assert log.summary(Mode.EVAL)['average_return'] == 20.0
  assert log.env_steps(Mode.TRAIN) == 4 and log.env_steps(Mode.EVAL) == 4
