"""The compiled batch step (seedacme/serving/tf_policy.py) against the network applied env by env.

The policy keeps every env's recurrent state in device tables and runs gather -> reset
-> network -> action selection -> scatter as one compiled call per batch-size bucket.
These tests compare it with the plain Sonnet network called on one env at a time.
"""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents import r2d2, vtrace
from seedacme.types import EnvSpec
from seedacme.serving.server import InferenceServer
from seedacme.wire.protocol import make_request
from seedacme.serving.tf_policy import bucket_sizes, use_xla

SPEC = EnvSpec(observation_shape=(3,), observation_dtype='float32', num_actions=4)
NUM_ENVS = 10


def _vtrace_policy(core='lstm', num_envs=NUM_ENVS, seed=0):
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(core=core, lstm_size=8,
                                                     hidden_sizes=(16,), seed=seed))
  net = builder.make_networks(SPEC)
  return net, builder.make_policy(net, SPEC, num_train_envs=num_envs, num_envs=num_envs)


def _one_env_step(net, obs, state):
  """The network on one env: ((logits [1, A], value), next_state)."""
  return net(tf.constant(obs[None]), state)


def test_bucket_sizes_cover_every_batch_with_bounded_padding():
  assert bucket_sizes(1) == (1,)
  assert bucket_sizes(36) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 36)
  for n in (5, 17, 100):
    buckets = bucket_sizes(n)
    for b in range(1, n + 1):
      fit = min(x for x in buckets if x >= b)
      assert fit - b <= max(1, b // 2)  # at most a third of a bucket is padding
  with pytest.raises(ValueError):
    bucket_sizes(0)


def test_batch_step_is_traced_once_per_bucket_and_never_again():
  _, policy = _vtrace_policy()
  rng = np.random.default_rng(0)
  used = set()
  for _ in range(60):
    size = int(rng.integers(1, NUM_ENVS + 1))
    ids = rng.permutation(NUM_ENVS)[:size]
    policy.step(ids, rng.random((size, 3), np.float32), rng.random(size) < 0.2,
                rng.random(size) < 0.5)
    used.add(min(b for b in policy.buckets if b >= size))
  assert policy.traces == len(used)
  traces = policy.traces
  for size in range(1, NUM_ENVS + 1):  # every size again: only new buckets may trace
    policy.step(np.arange(size), np.zeros((size, 3), np.float32), np.zeros(size, bool),
                np.zeros(size, bool))
  assert policy.traces == len(policy.buckets)
  assert policy.traces - traces == len(set(policy.buckets) - used)


def test_state_stays_in_the_device_table_across_mixed_batches():
  net, policy = _vtrace_policy()
  rng = np.random.default_rng(1)
  steps = 12
  obs = rng.random((steps, NUM_ENVS, 3), np.float32)
  # Env e's expected state: N single-env calls of the network from the initial state.
  expected = []
  for e in range(NUM_ENVS):
    state = net.initial_state(1)
    for t in range(steps):
      _, state = _one_env_step(net, obs[t, e], state)
    expected.append([leaf.numpy()[0] for leaf in tf.nest.flatten(state)])
  # Served: every step in shuffled batches of random sizes mixing envs (padding too).
  for t in range(steps):
    order = rng.permutation(NUM_ENVS)
    cuts = np.sort(rng.choice(np.arange(1, NUM_ENVS), size=2, replace=False))
    for ids in np.split(order, cuts):
      policy.step(ids, obs[t, ids], np.full(len(ids), t == 0), np.zeros(len(ids), bool))
  stored = policy.state_of(np.arange(NUM_ENVS))
  for e in range(NUM_ENVS):
    for leaf, want in zip(tf.nest.flatten(stored), expected[e]):
      np.testing.assert_allclose(leaf[e], want, rtol=1e-5, atol=1e-6)


def test_outputs_equal_the_network_env_by_env():
  net, policy = _vtrace_policy()
  rng = np.random.default_rng(2)
  ids = np.array([7, 2, 5])
  # Advance the three envs a few steps so their states differ.
  for t in range(3):
    policy.step(ids, rng.random((3, 3), np.float32), np.full(3, t == 0), np.zeros(3, bool))
  before = policy.state_of(ids)
  obs = rng.random((3, 3), np.float32)
  out = policy.step(ids, obs, np.zeros(3, bool), np.ones(3, bool))  # greedy
  after = policy.state_of(ids)
  for i in range(3):
    state_i = tf.nest.map_structure(lambda x, i=i: tf.constant(x[i:i + 1]), before)
    (logits, _), next_state = _one_env_step(net, obs[i], state_i)
    np.testing.assert_allclose(out.extras['logits'][i], logits.numpy()[0], rtol=1e-5,
                               atol=1e-6)
    assert out.action[i] == int(np.argmax(logits.numpy()[0]))
    for got, want in zip(tf.nest.flatten(out.state), tf.nest.flatten(before)):
      np.testing.assert_allclose(got[i], want[i])  # the state it acted from
    for got, want in zip(tf.nest.flatten(after), tf.nest.flatten(next_state)):
      np.testing.assert_allclose(got[i], want.numpy()[0], rtol=1e-5, atol=1e-6)


def _r2d2_policy_equals_network(spec, config, observations, atol):
  """Steps evaluation envs 5 and 4 (greedy, epsilon 0) through R2D2's policy and its
  online network side by side: Q-values, actions and stored state agree. The policy."""
  builder = r2d2.R2D2Builder(config)
  nets = builder.make_networks(spec)
  policy = builder.make_policy(nets, spec, num_train_envs=4, num_envs=6)
  ids = np.array([5, 4])
  state = nets.online.initial_state(2)
  for t, obs in enumerate(observations):
    out = policy.step(ids, obs, np.full(2, t == 0), np.ones(2, bool))
    q, state = nets.online(tf.constant(obs), state)
    np.testing.assert_allclose(out.extras['q'], q.numpy(), rtol=1e-5, atol=atol)
    np.testing.assert_array_equal(out.action, np.argmax(q.numpy(), axis=-1))
  for got, want in zip(tf.nest.flatten(policy.state_of(ids)), tf.nest.flatten(state)):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=atol)
  return policy


def test_r2d2_q_values_greedy_actions_and_state_equal_the_network():
  rng = np.random.default_rng(3)
  _r2d2_policy_equals_network(SPEC, r2d2.R2D2Config(lstm_size=8, hidden_sizes=(8,)),
                              [rng.random((2, 3), np.float32) for _ in range(4)], 1e-6)


def test_xla_on_accelerators_and_for_vector_observations_only():
  image = EnvSpec((44, 44, 4), 'uint8', 6)
  assert use_xla('/CPU:0', SPEC) and use_xla('/job:localhost/replica:0/task:0/device:CPU:2',
                                             SPEC)
  assert not use_xla('/CPU:0', image)
  assert not use_xla('/job:localhost/replica:0/task:0/device:CPU:1', image)
  assert use_xla('/GPU:0', image) and use_xla('/device:TPU:0', image)
  assert _vtrace_policy()[1].jit_compile


def test_the_environment_can_force_xla_on_or_off(monkeypatch):
  image = EnvSpec((44, 44, 4), 'uint8', 6)
  monkeypatch.setenv('SEEDACME_INFERENCE_XLA', '1')
  assert use_xla('/CPU:0', image)
  monkeypatch.setenv('SEEDACME_INFERENCE_XLA', '0')
  assert not use_xla('/GPU:0', SPEC)
  monkeypatch.setenv('SEEDACME_INFERENCE_XLA', 'yes')
  with pytest.raises(ValueError, match="SEEDACME_INFERENCE_XLA='yes'"):
    use_xla('/CPU:0', SPEC)


def test_image_policy_without_xla_equals_the_network():
  """The conv policy (not XLA-compiled on the CPU) still computes what the network does."""
  rng = np.random.default_rng(4)
  policy = _r2d2_policy_equals_network(
      EnvSpec((44, 44, 4), 'uint8', 6), r2d2.R2D2Config(torso='nature_cnn', lstm_size=8),
      [rng.integers(0, 256, (2, 44, 44, 4)).astype(np.uint8) for _ in range(3)], 1e-5)
  assert not policy.jit_compile


def test_sampled_actions_follow_the_logits():
  """Chi-square goodness of fit of 16,000 sampled actions against softmax(logits)."""
  net, policy = _vtrace_policy(core='feedforward', num_envs=64, seed=5)
  head = [v for v in net.variables if '/policy/' in v.name]
  for v in head:  # logits = bias: a fixed, clearly non-uniform distribution
    v.assign(tf.zeros_like(v) if v.shape.rank == 2 else tf.constant([1.0, 0.0, -1.0, 0.5]))
  probs = tf.nn.softmax(tf.constant([1.0, 0.0, -1.0, 0.5])).numpy()
  counts = np.zeros(4)
  ids = np.arange(64)
  obs = np.random.default_rng(4).random((64, 3), np.float32)
  for _ in range(250):
    out = policy.step(ids, obs, np.zeros(64, bool), np.zeros(64, bool))
    counts += np.bincount(out.action, minlength=4)
  expected = probs * counts.sum()
  chi2 = float(((counts - expected) ** 2 / expected).sum())
  assert chi2 < 16.27, (counts, expected)  # df = 3, p = 0.001
  # ... and a wrong distribution (uniform) is rejected by the same test.
  uniform = np.full(4, counts.sum() / 4)
  assert float(((counts - uniform) ** 2 / uniform).sum()) > 16.27


def test_run_id_change_clears_one_envs_state_and_nothing_else():
  net, policy = _vtrace_policy(num_envs=4)
  server = InferenceServer(policy, SPEC, 4, None, max_batch_envs=1, batch_timeout_s=0.0)
  obs = np.full((4, 3), 0.5, np.float32)

  def request(run_ids, step_type):
    return make_request(np.arange(4), run_ids, obs, np.zeros(4), np.ones(4),
                        np.full(4, step_type))
  try:
    server.step(request([1, 1, 1, 1], 0))
    server.step(request([1, 1, 1, 1], 1))
    before = policy.state_of(np.arange(4))
    server.step(request([1, 2, 1, 1], 1))  # env 1's actor restarted (MID step!)
    after = policy.state_of(np.arange(4))
  finally:
    server.close()
  # Env 1: one step from the initial state. The others: one more step from `before`.
  _, fresh = _one_env_step(net, obs[1], net.initial_state(1))
  for got, want in zip(tf.nest.flatten(after), tf.nest.flatten(fresh)):
    np.testing.assert_allclose(got[1], want.numpy()[0], rtol=1e-5, atol=1e-6)
  for e in (0, 2, 3):
    state_e = tf.nest.map_structure(lambda x, e=e: tf.constant(x[e:e + 1]), before)
    _, cont = _one_env_step(net, obs[e], state_e)
    for got, want in zip(tf.nest.flatten(after), tf.nest.flatten(cont)):
      np.testing.assert_allclose(got[e], want.numpy()[0], rtol=1e-5, atol=1e-6)
  assert server.actor_restarts == 1
