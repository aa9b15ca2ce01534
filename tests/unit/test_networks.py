"""Torsos and recurrent cores: shapes, uint8 frames, unroll == step-by-step with resets."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme import networks
from seedacme.agents.r2d2.networks import RecurrentQNetwork
from seedacme.agents.vtrace.networks import make_network


@pytest.mark.parametrize('kind,features', [('nature_cnn', 512), ('impala_resnet', 256),
                                           ('mlp', 32)])
def test_torsos_on_atari_frames(kind, features):
  torso = networks.make_torso(kind, hidden_sizes=(32,))
  frames = tf.constant(np.random.default_rng(0).integers(0, 255, (3, 84, 84, 4)), tf.uint8)
  out = torso(frames)
  assert out.shape == (3, features) and out.dtype == tf.float32
  # uint8 frames are scaled to [0, 1] on the device: same output as pre-scaled floats.
  np.testing.assert_allclose(out.numpy(), torso(tf.cast(frames, tf.float32) / 255.0).numpy(),
                             rtol=1e-5, atol=1e-5)


def _manual_unroll(net, obs, first, state):
  outputs = []
  for t in range(obs.shape[0]):
    reset = first[t][:, None]
    state = tuple(tf.where(reset, tf.zeros_like(s), s) for s in state)
    out, state = net(obs[t], state)
    outputs.append(out)
  return outputs, state


def test_unroll_matches_stepping_with_episode_resets():
  rng = np.random.default_rng(1)
  obs = tf.constant(rng.normal(size=(6, 3, 5)), tf.float32)
  first = tf.constant(rng.random((6, 3)) < 0.3)
  vtrace_net = make_network('lstm', 4, (8,), 8)
  state = tuple(tf.constant(rng.normal(size=(3, 8)), tf.float32) for _ in range(2))
  logits, values = vtrace_net.unroll(obs, first, state)
  steps, _ = _manual_unroll(vtrace_net, obs, first, state)
  np.testing.assert_allclose(logits.numpy(), np.stack([s[0].numpy() for s in steps]), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(values.numpy(), np.stack([s[1].numpy() for s in steps]), rtol=1e-5,
                             atol=1e-6)

  q_net = RecurrentQNetwork(4, (8,), 8)
  q, final = q_net.unroll(obs, first, state)
  steps, expected_final = _manual_unroll(q_net, obs, first, state)
  np.testing.assert_allclose(q.numpy(), np.stack([s.numpy() for s in steps]), rtol=1e-5,
                             atol=1e-6)
  for a, b in zip(final, expected_final):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
