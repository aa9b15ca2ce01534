"""A reproducible run's learner takes whole rounds in env-id order (`RoundBatches`,
issue 63): whatever order the unrolls reached the Reverb queue in, learner step k of a
round trains on envs kB .. (k+1)B - 1; a round that is not one unroll per env is a
named error, not a silently different run.

On a real Reverb queue, and once through V-trace's own path (its policy stores each
step's env id, its sink writes the unrolls, its builder makes the batches).
"""

import numpy as np
import pytest
import reverb
import tensorflow as tf

from seedacme.agents import vtrace
from seedacme.trajectories.datasets import ReverbBatches, RoundBatches, RoundOrderError
from seedacme.types import EnvSpec

SIGNATURE = {'x': tf.TensorSpec((3,), tf.float32), 'env_id': tf.TensorSpec((3,), tf.int32)}


def _insert(client, env_ids, tag) -> None:
  writer = client.trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=60_000)
  try:
    for e in env_ids:
      writer.append({'x': np.full(3, 100 * tag + e, np.float32),
                     'env_id': np.full(3, e, np.int32)})
      writer.create_item('q', 1.0, {k: writer.history[k][-1] for k in SIGNATURE})
    writer.flush(timeout_ms=10_000)
  finally:
    writer.close()


@pytest.fixture
def queue():
  server = reverb.Server([reverb.Table.queue('q', 32, signature=SIGNATURE)])
  client = reverb.Client(f'localhost:{server.port}')
  batches = RoundBatches(ReverbBatches(f'localhost:{server.port}', 'q', 8, timeout_ms=300,
                                       prefetch=0, max_in_flight=8), batch_size=4)
  yield client, batches
  batches.close()
  server.stop()


def _next(batches, wait_until):
  got = []
  assert wait_until(lambda: got.append(batches.next()) or got[-1] is not None, 30, 0.01)
  return got[-1]


@pytest.mark.timeout(120)
def test_a_round_inserted_in_any_order_comes_out_in_env_id_order(queue, wait_until):
  client, batches = queue
  rng = np.random.default_rng(0)
  for tag in range(2):
    order = rng.permutation(8)
    assert not np.array_equal(order, np.arange(8))
    _insert(client, order.tolist(), tag)
    for first in (0, 4):
      batch = _next(batches, wait_until)
      assert batch['env_id'].shape == (4, 3)
      np.testing.assert_array_equal(batch['env_id'][:, 0], np.arange(first, first + 4))
      # Each unroll's data came with its id (not only the ids were sorted).
      np.testing.assert_array_equal(batch['x'][:, 0], 100 * tag + np.arange(first, first + 4))
  assert batches.rounds == 2


@pytest.mark.timeout(120)
def test_a_round_that_is_not_one_unroll_per_env_is_a_named_error(queue, wait_until):
  client, batches = queue
  _insert(client, [0, 1, 2, 3, 4, 2, 6, 7], 0)  # env 2 twice, env 5 lost
  with pytest.raises(RoundOrderError, match=r'missing \[5\], twice \[2\]'):
    _next(batches, wait_until)


SPEC = EnvSpec((3,), 'float32', 2)


@pytest.mark.timeout(300)
def test_vtraces_unrolls_reach_its_learner_by_env_id_whatever_the_arrival(wait_until):
  """Four calls of eight envs (round 0: the reset and T = 3 steps), each call served
  as two requests of four envs in a new random order, as actors arrive."""
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=3, batch_size=4,
                                                     hidden_sizes=(8,), queue_size=16))
  assert 'env_id' in builder.item_signature(SPEC)
  server = reverb.Server(builder.make_replay_tables(SPEC), port=None)
  client = reverb.Client(f'localhost:{server.port}')
  assert isinstance(builder.make_batches(client), ReverbBatches)  # no schedule: as ever
  builder.schedule = builder.round_schedule(8)
  batches = builder.make_batches(client)
  assert isinstance(batches, RoundBatches)
  policy = builder.make_policy(builder.make_networks(SPEC), SPEC, 8, 8)
  sink = builder.make_trajectory_sink(client, 8, SPEC)
  rng = np.random.default_rng(1)
  try:
    for n in range(4):
      for ids in np.split(rng.permutation(8), 2):
        # Observation of env e at call n: e + n / 10, to be found again in the batch.
        observation = np.repeat((ids + n / 10)[:, None], 3, 1).astype(np.float32)
        out = policy.step(ids, observation, np.full(4, n == 0), np.zeros(4, bool))
        np.testing.assert_array_equal(out.extras['env_id'], ids)
        first = n == 0
        sink.add(ids, {'observation': observation, 'reward': np.zeros(4, np.float32),
                       'discount': np.ones(4, np.float32),
                       'step_type': np.full(4, 0 if first else 1, np.int8),
                       'action': out.action, 'extras': out.extras, 'state': out.state})
    assert sink.wait_until_written(30)
    for first in (0, 4):
      batch = _next(batches, wait_until)
      envs = np.arange(first, first + 4)
      np.testing.assert_array_equal(batch['env_id'].numpy(), np.repeat(envs[:, None], 4, 1))
      np.testing.assert_allclose(batch['observation'][:, :, 0].numpy(),
                                 envs[:, None] + np.arange(4)[None] / 10, rtol=1e-6)
  finally:
    batches.close()
    sink.close()
    server.stop()
