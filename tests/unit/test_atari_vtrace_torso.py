"""The registry's Atari V-trace settings keep the Nature CNN torso alive on Pong.

A regression test for a failure seen on a real run: with Adam's default epsilon (1e-7)
every parameter moves ~lr per update however small its gradient, and the early, consistent
pull of the value towards Pong's mean return drove the first conv layer's units below
zero on every frame. After 16k updates no unit of conv0 was active, the policy was the
same for every frame and returns stayed at random's. Here: 200 learner updates on
unrolls of random Pong play (real frames, real rewards), then every conv layer must
still have most of the units it had alive at the start, and its weights must have moved
(the torso learns; it is not frozen). With adam_epsilon=1e-7 (and the orthogonal init)
conv0 fell from 69 % to 25 % of units alive in these 200 updates. The registry's
optimizer is IMPALA's RMSprop since Pong learned faster with it; the test also runs
the Adam setting it replaced (epsilon 1e-3), which stays available.
"""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents import registry
from seedacme.agents.vtrace.learning import VTraceLearner
from seedacme.agents.vtrace.networks import make_network
from tests.unit.pong_unrolls import conv_alive, random_play_unrolls


@pytest.fixture(scope='module')
def unrolls():
  """The Pong unrolls, played once for both optimizers' cases."""
  return random_play_unrolls()


@pytest.mark.long('trains the Atari torso on real Pong frames: 35-50 s per optimizer')
@pytest.mark.timeout(300)
@pytest.mark.parametrize('optimizer', [None, 'adam'])
def test_registry_atari_settings_keep_the_torso_alive(optimizer, unrolls):
  assert sum(int((u['reward'] != 0).sum()) for u in unrolls) > 10  # points were lost
  overrides = {'optimizer': optimizer} if optimizer else {}
  config = registry.make_builder('vtrace', 'atari', batch_size=8, **overrides).config
  tf.random.set_seed(0)
  network = make_network(config.core, 6, config.hidden_sizes, config.lstm_size,
                         config.torso)
  frames = tf.constant(np.stack([u['observation'][0] for u in unrolls[::2]]))
  network(frames[:1], ())
  learner = VTraceLearner(network, config, None)
  convs = network.torso.convs
  before_w = [c.w.numpy().copy() for c in convs]
  before = conv_alive(network.torso, frames)
  rng = np.random.RandomState(1)
  for _ in range(200):
    idx = rng.choice(len(unrolls), config.batch_size, replace=False)
    learner.train_on({k: tf.constant(np.stack([unrolls[j][k] for j in idx]))
                      for k in unrolls[0]})
  after = conv_alive(network.torso, frames)
  moved = [np.linalg.norm(c.w.numpy() - w) / np.linalg.norm(w)
           for c, w in zip(convs, before_w)]
  # The failure this guards against is a collapse (conv0 kept 0.36 of its units with
  # Adam's epsilon 1e-7); healthy settings keep >= 0.84 of every layer's here (RMSprop's
  # conv1: 0.797 -> 0.672 alive), so the bar is 0.75.
  assert np.all(after >= 0.75 * before), (before, after)
  assert min(moved) > 0.005, moved
