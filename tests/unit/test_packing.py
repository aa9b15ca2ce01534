"""Packed replay items (`seedacme.trajectories.packing`): exact round trips, clear errors,
and SAC's learner taking packed batches as it takes fields."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents.sac import SACBuilder, SACConfig
from seedacme.agents.sac.learning import SACLearner
from seedacme.trajectories.packing import PACKED, PackedLayout
from seedacme.types import FIRST, LAST, MID, EnvSpec


def _layout():
  return PackedLayout({'observation': ((2, 3), np.float32), 'reward': ((), np.float32),
                       'step_type': ((), np.int8), 'action': ((), np.int32),
                       'wide': ((), np.float64)})


def _item(rng, lead=(4,)):
  return {'observation': rng.normal(size=lead + (2, 3)).astype(np.float32),
          'reward': rng.normal(size=lead).astype(np.float32),
          'step_type': rng.choice([FIRST, MID, LAST], size=lead).astype(np.int8),
          'action': rng.integers(-2**23, 2**23, size=lead).astype(np.int32),
          'wide': rng.normal(size=lead)}


@pytest.mark.parametrize('lead', [(4,), (5, 4)], ids=['item', 'batch of items'])
def test_round_trip_is_exact_for_float32_and_small_integers(lead):
  layout = _layout()
  assert layout.width == 6 + 1 + 1 + 1 + 1
  item = _item(np.random.default_rng(0), lead)
  packed = layout.pack(item)
  assert set(packed) == {PACKED} and packed[PACKED].shape == lead + (layout.width,)
  assert packed[PACKED].dtype == np.float32
  out = {k: v.numpy() for k, v in layout.unpack(tf.constant(packed[PACKED])).items()}
  for name in ('observation', 'reward', 'step_type', 'action'):
    assert out[name].dtype == item[name].dtype, name
    np.testing.assert_array_equal(out[name], item[name], err_msg=name)
  assert out['wide'].dtype == np.float64  # rounded to float32 on the way
  np.testing.assert_allclose(out['wide'], item['wide'], rtol=1e-7)
  assert layout.signature(4) == {PACKED: tf.TensorSpec((4, layout.width), tf.float32)}


def test_bad_items_and_layouts_name_the_field():
  layout = _layout()
  item = _item(np.random.default_rng(1))
  del item['reward']
  with pytest.raises(KeyError, match='reward'):
    layout.pack(item)
  item = _item(np.random.default_rng(1))
  item['observation'] = item['observation'][..., :2]
  with pytest.raises(ValueError, match="'observation'"):
    layout.pack(item)
  with pytest.raises(ValueError, match="'name'"):
    PackedLayout({'name': ((), np.str_)})


def test_sac_learns_the_same_from_packed_and_field_batches():
  spec = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -1.0), (1.0, 1.0))
  rng = np.random.default_rng(2)
  fields = {'observation': rng.normal(size=(8, 2, 5)).astype(np.float32),
            'reward': rng.normal(size=(8, 2)).astype(np.float32),
            'discount': np.ones((8, 2), np.float32),
            'step_type': np.array([[FIRST, MID]] * 6 + [[MID, LAST]] * 2, np.int8),
            'raw_action': rng.normal(size=(8, 2, 2)).astype(np.float32)}
  results = []
  for packed in (False, True):
    builder = SACBuilder(SACConfig(batch_size=8, min_replay_size=8, hidden_sizes=(16,),
                                   packed_items=packed))
    tf.random.set_seed(0)
    nets = builder.make_networks(spec)
    if results:
      for v, value in zip(nets.variables, results[0][0]):
        v.assign(value)
    start = [v.numpy().copy() for v in nets.variables]
    learner = SACLearner(nets, builder.config, None, builder.item_signature(spec),
                         layout=builder.layout(spec))
    assert learner.warm_up()  # traces the step for the table's (packed) signature
    layout = builder.layout(spec)
    batch = layout.pack(fields) if packed else fields
    assert (PACKED in builder.item_signature(spec)) == packed
    metrics = learner.train_on(tf.nest.map_structure(tf.constant, batch))
    results.append((start, [v.numpy() for v in nets.variables], metrics))
  (_, a, m1), (_, b, m2) = results
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert m1['critic_loss'] == pytest.approx(m2['critic_loss'], rel=1e-5)
