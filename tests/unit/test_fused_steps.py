"""Several gradient steps per sampled batch (`sgd_steps_per_sample`, SAC and R2D2).

A call on `k * batch_size` items must be exactly k single steps on consecutive slices:
same variables after, same priorities per item, learner steps counted by gradient step.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.r2d2 import R2D2Builder, R2D2Config
from seedacme.agents.r2d2.learning import R2D2Learner, sequence_loss
from seedacme.agents.sac import SACBuilder, SACConfig
from seedacme.agents.sac.learning import SACLearner
from seedacme.learner import fused
from seedacme.learner.loop import LearnerLoop
from seedacme.launchers import accelerator_check
from seedacme.types import EnvSpec

K, B = 3, 4


def _batch(signature, n, seed=0):
  """n items of `signature`: FIRST then MID steps, random observations and actions."""
  return accelerator_check.synthetic_batch(signature, n, num_actions=3, seed=seed)


def _slice(batch, i):
  return tf.nest.map_structure(lambda x: x[i * B:(i + 1) * B], batch)


def _values(variables):
  return [v.numpy().copy() for v in variables]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def _sac_learner(k):
  spec = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -1.0), (1.0, 1.0))
  config = SACConfig(batch_size=B, min_replay_size=B, hidden_sizes=(16,), tau=0.1,
                     sgd_steps_per_sample=k)
  builder = SACBuilder(config)
  tf.random.set_seed(0)
  nets = builder.make_networks(spec)
  return nets, SACLearner(nets, config, None, builder.item_signature(spec), builder.layout(spec)), builder, spec


def test_sac_fused_steps_equal_single_steps_on_consecutive_slices():
  nets1, single, builder, spec = _sac_learner(1)
  nets3, fused, _, _ = _sac_learner(K)
  for a, b in zip(nets3.variables, nets1.variables):
    a.assign(b)  # same start
  before = _values(nets1.variables)
  batch = _batch(builder.item_signature(spec), K * B)
  metrics = [single.train_on(_slice(batch, i)) for i in range(K)]
  fused_metrics = fused.train_on(batch)
  after = _values(nets1.variables)
  assert any(not np.array_equal(x, y) for x, y in zip(before, after))
  _assert_same(_values(nets3.variables), after)  # targets and temperature included
  assert int(fused.num_steps.numpy()) == int(single.num_steps.numpy()) == K
  assert fused_metrics['critic_loss'] == pytest.approx(
      np.mean([m['critic_loss'] for m in metrics]), rel=1e-4)


class _Info:
  """What R2D2's `train_on` reads of a Reverb sample's info (uniform priorities)."""

  def __init__(self, keys):
    n = len(keys)
    self.probability = tf.fill([n], 1.0 / 100)
    self.table_size = tf.fill([n], tf.constant(100, tf.int64))
    self.key = tf.constant(keys, tf.uint64)


class _Priorities:
  """A replay client that records priority updates (one dict per call)."""

  def __init__(self):
    self.calls = []

  def mutate_priorities(self, table, updates):
    del table
    self.calls.append(dict(updates))


def _r2d2_learner(k, target_update_period=1000):
  spec = EnvSpec((6,), 'float32', 3)
  builder = R2D2Builder(R2D2Config(burn_in=2, trace_length=4, batch_size=B,
                                   hidden_sizes=(16,), lstm_size=8, sgd_steps_per_sample=k,
                                   target_update_period=target_update_period))
  networks = builder.make_networks(spec)
  client = _Priorities()
  learner = R2D2Learner(networks.online, networks.target, builder.config, None, client,
                        builder.table, builder.item_signature(spec))
  return networks, learner, client, builder, spec


def test_r2d2_fused_steps_equal_single_steps_and_write_every_priority_once():
  nets1, single, client1, builder, spec = _r2d2_learner(1)
  nets3, fused, client3, _, _ = _r2d2_learner(K)
  for a, b in zip(nets3.online.variables, nets1.online.variables):
    a.assign(b)
  fused.update_target()
  single.update_target()
  batch = _batch(builder.item_signature(spec), K * B)
  keys = np.arange(100, 100 + K * B)
  for i in range(K):
    single.train_on(_Info(keys[i * B:(i + 1) * B]), _slice(batch, i))
  fused.train_on(_Info(keys), batch)
  _assert_same(_values(nets3.online.variables), _values(nets1.online.variables))
  assert len(client1.calls) == K and len(client3.calls) == 1  # one update per call
  sequential = {key: p for call in client1.calls for key, p in call.items()}
  assert sorted(client3.calls[0]) == sorted(sequential) == keys.tolist()
  for key, p in client3.calls[0].items():
    assert p == pytest.approx(sequential[key], rel=1e-4, abs=1e-6)
  assert int(fused.num_steps.numpy()) == K


def test_r2d2_target_copied_once_the_step_count_passes_its_period():
  nets, learner, _, builder, spec = _r2d2_learner(K, target_update_period=4)
  batch = _batch(builder.item_signature(spec), K * B)
  start = _values(nets.target.variables)
  learner.train_on(_Info(np.arange(K * B)), batch)  # steps 1-3: no multiple of 4 passed
  _assert_same(_values(nets.target.variables), start)
  learner.train_on(_Info(np.arange(K * B)), batch)  # steps 4-6: copied after step 6
  _assert_same(_values(nets.target.variables), _values(nets.online.variables))


def test_the_learner_loop_counts_gradient_steps():
  _, learner, _, builder, spec = _r2d2_learner(K)
  batch = _batch(builder.item_signature(spec), K * B)
  calls = []

  def step():
    calls.append(1)
    return learner.train_on(_Info(np.arange(K * B)), batch)
  learner.step = step
  stop = threading.Event()
  loop = LearnerLoop(learner, stop, should_stop=lambda steps: steps >= 2 * K)
  loop.start()
  assert loop.join(60)
  assert loop.error is None
  assert len(calls) == 2 and loop.steps == 2 * K == int(learner.num_steps.numpy())


def test_a_bad_count_is_refused():
  with pytest.raises(ValueError, match='sgd_steps_per_sample'):
    SACConfig(sgd_steps_per_sample=0)
  with pytest.raises(ValueError, match='sgd_steps_per_sample'):
    R2D2Config(sgd_steps_per_sample=0)


@pytest.mark.parametrize('n,sizes', [(12, [4, 4, 4]), (10, [3, 3, 4]), (2, [1, 1])])
def test_a_short_sample_splits_without_dropping_or_repeating_items(n, sizes):
  x = tf.range(n)
  parts = fused.slices(3, x, {'y': 2 * x})
  assert [int(p[0].shape[0]) for p in parts] == sizes
  np.testing.assert_array_equal(np.concatenate([p[0].numpy() for p in parts]), np.arange(n))
  np.testing.assert_array_equal(np.concatenate([p[1]['y'].numpy() for p in parts]),
                                2 * np.arange(n))


def test_r2d2_reports_the_size_of_the_gradient_it_steps_with():
  """`grad_norm` is the global norm of the step's gradient (taken before the update,
  recomputed here with its own tape) and `grad_rms` that norm per parameter."""
  nets, learner, _, builder, spec = _r2d2_learner(1)
  batch = _batch(builder.item_signature(spec), B, seed=3)
  variables = nets.online.trainable_variables
  with tf.GradientTape() as tape:
    loss, _, _ = sequence_loss(nets.online, nets.target, batch, tf.ones([B]), builder.config)
  norm = float(tf.linalg.global_norm(tape.gradient(loss, variables)))
  metrics = learner.train_on(_Info(np.arange(B)), batch)
  assert norm > 0
  assert metrics['grad_norm'] == pytest.approx(norm, rel=1e-4)
  size = sum(int(np.prod(v.shape)) for v in variables)
  assert metrics['grad_rms'] == pytest.approx(norm / np.sqrt(size), rel=1e-4)
