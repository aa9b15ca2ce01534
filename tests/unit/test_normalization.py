"""Running observation normalization: exact statistics, shared readers, checkpoints."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

from seedacme.normalization import RunningNormalizer

SHAPE = (3, 2)


def _batches(seed=0):
  """Random batches of different sizes, some with a mask; the unmasked rows, stacked."""
  rng = np.random.default_rng(seed)
  batches, seen = [], []
  for i, size in enumerate((1, 7, 64, 3, 200, 5, 31)):
    x = 5.0 + 3.0 * rng.normal(size=(size, *SHAPE)) * np.arange(1, 7).reshape(SHAPE)
    mask = rng.random(size) < 0.6 if i % 2 else None
    batches.append((x.astype(np.float32), mask))
    seen.append(x.astype(np.float32)[mask if mask is not None else slice(None)])
  return batches, np.concatenate(seen).astype(np.float64)


def _update_all(normalizer, batches, update=None):
  update = update or normalizer.update
  for x, mask in batches:
    update(tf.constant(x), None if mask is None else tf.constant(mask))


def _expected(x, rows, clip=10.0, eps=1e-8):
  return np.clip((x - rows.mean(0)) / np.sqrt(rows.var(0) + eps), -clip, clip)


def test_statistics_equal_numpys_over_the_unmasked_rows():
  normalizer = RunningNormalizer(SHAPE)
  batches, rows = _batches()
  _update_all(normalizer, batches)
  assert normalizer.count.numpy() == len(rows)
  np.testing.assert_allclose(normalizer.mean.numpy(), rows.mean(0), rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(normalizer.var.numpy(), rows.var(0), rtol=1e-6, atol=1e-9)
  # An all-masked batch changes nothing.
  normalizer.update(tf.ones([4, *SHAPE]) * 1e6, tf.zeros([4], tf.bool))
  assert normalizer.count.numpy() == len(rows)
  np.testing.assert_allclose(normalizer.mean.numpy(), rows.mean(0), rtol=1e-6, atol=1e-9)


def test_normalize_matches_numpy_with_clipping_on_any_leading_dimensions():
  normalizer = RunningNormalizer(SHAPE)
  batches, rows = _batches(1)
  _update_all(normalizer, batches)
  rng = np.random.default_rng(2)
  x = (5.0 + 10.0 * rng.normal(size=(4, 5, *SHAPE))).astype(np.float32)
  x[0, 0] = 1e4  # far outside: clipped to +10
  x[1, 1] = -1e4
  out = normalizer(tf.constant(x))  # [T, B, *shape]
  assert out.dtype == tf.float32 and out.shape == x.shape
  np.testing.assert_allclose(out.numpy(), _expected(x.astype(np.float64), rows), atol=1e-5)
  assert (out.numpy()[0, 0] == 10.0).all() and (out.numpy()[1, 1] == -10.0).all()
  flat = normalizer(tf.constant(x.reshape(20, *SHAPE)))  # [N, *shape]
  np.testing.assert_array_equal(flat.numpy(), out.numpy().reshape(20, *SHAPE))
  with pytest.raises(ValueError, match='normalized shape'):
    normalizer(tf.zeros([4, 2, 3]))


def test_before_any_update_it_is_the_identity_up_to_clipping():
  normalizer = RunningNormalizer([2], clip=5.0)
  x = np.array([[0.5, -3.0], [7.0, -100.0]], np.float32)
  np.testing.assert_allclose(normalizer(tf.constant(x)).numpy(), np.clip(x, -5.0, 5.0),
                             rtol=1e-6)


def test_inference_and_learner_read_the_same_statistics():
  normalizer = RunningNormalizer(SHAPE)
  inference = tf.function(lambda x: normalizer(x), jit_compile=True)

  @tf.function
  def learner_step(batch, mask):
    normalizer.update(batch, mask)
    return normalizer(batch)

  probe = tf.constant(np.random.default_rng(3).normal(size=(6, *SHAPE)), tf.float32)
  before = inference(probe).numpy()
  batches, _ = _batches(4)
  for x, mask in batches:
    mask = np.ones(len(x), bool) if mask is None else mask
    learned = learner_step(tf.constant(x), tf.constant(mask))
    np.testing.assert_array_equal(inference(tf.constant(x)).numpy(), learned.numpy())
  assert not np.allclose(inference(probe).numpy(), before)  # reads variables, not constants


def test_update_inside_tf_function_and_xla_matches_eager():
  batches, rows = _batches(5)
  for jit in (False, True):
    normalizer = RunningNormalizer(SHAPE)
    update = tf.function(normalizer.update, jit_compile=jit)
    _update_all(normalizer, [(x, np.ones(len(x), bool) if m is None else m)
                             for x, m in batches], update)
    np.testing.assert_allclose(normalizer.mean.numpy(), rows.mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(normalizer.var.numpy(), rows.var(0), rtol=1e-6, atol=1e-9)


class _Network(snt.Module):

  def __init__(self):
    super().__init__(name='network')
    self.normalizer = RunningNormalizer(SHAPE)
    self._linear = snt.Linear(2)

  def __call__(self, x):
    return self._linear(snt.Flatten()(self.normalizer(x)))


def test_statistics_are_checkpointed_with_the_network(tmp_path):
  network = _Network()
  network(tf.zeros([1, *SHAPE]))
  batches, rows = _batches(6)
  _update_all(network.normalizer, batches)
  names = {v.name for v in network.variables}
  assert {'network/running_normalizer/mean:0', 'network/running_normalizer/var:0',
          'network/running_normalizer/count:0'} <= names
  assert not any('normalizer' in v.name for v in network.trainable_variables)
  path = tf.train.Checkpoint(network=network).save(str(tmp_path / 'ckpt'))

  fresh = _Network()
  fresh(tf.zeros([1, *SHAPE]))
  tf.train.Checkpoint(network=fresh).restore(path).assert_consumed()
  for name in ('count', 'mean', 'var'):
    np.testing.assert_array_equal(getattr(fresh.normalizer, name).numpy(),
                                  getattr(network.normalizer, name).numpy())
  x = tf.constant(rows[:5], tf.float32)
  np.testing.assert_array_equal(fresh(x).numpy(), network(x).numpy())
