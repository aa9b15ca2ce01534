"""The registry's Atari V-trace settings keep the Nature CNN torso alive on Pong.

A regression test for a failure seen on a real run: with Adam's default epsilon (1e-7)
every parameter moves ~lr per update however small its gradient, and the early, consistent
pull of the value towards Pong's mean return drove the first conv layer's units below
zero on every frame. After 16k updates no unit of conv0 was active, the policy was the
same for every frame and returns stayed at random's. Here: 200 learner updates on
unrolls of random Pong play (real frames, real rewards), then every conv layer must
still have most of the units it had alive at the start, and its weights must have moved
(the torso learns; it is not frozen). With adam_epsilon=1e-7 (and the orthogonal init)
conv0 fell from 69 % to 25 % of units alive in these 200 updates.
"""

import numpy as np
import tensorflow as tf

from seedacme.agents import registry
from seedacme.agents.vtrace.learning import VTraceLearner
from seedacme.agents.vtrace.networks import make_network
from seedacme.envs.atari_vector import AtariVectorEnv
from seedacme.networks import to_float

NUM_ENVS, T, SEGMENTS = 16, 20, 8


def _random_play_unrolls():
  env = AtariVectorEnv('Pong', NUM_ENVS, seed=3)
  rng = np.random.RandomState(0)
  steps = []
  try:
    ts = env.reset()
    for _ in range(T * SEGMENTS + 1):
      action = rng.randint(env.spec.num_actions, size=NUM_ENVS).astype(np.int32)
      steps.append(dict(observation=np.asarray(ts.observation),
                        step_type=np.asarray(ts.step_type),
                        reward=np.asarray(ts.reward, np.float32),
                        discount=np.asarray(ts.discount, np.float32), action=action,
                        logits=np.zeros((NUM_ENVS, env.spec.num_actions), np.float32)))
      ts, _ = env.step(action)
  finally:
    env.close()
  unrolls = []
  for start in range(0, T * SEGMENTS, T):
    segment = steps[start:start + T + 1]
    for e in range(NUM_ENVS):
      unrolls.append({k: np.stack([s[k][e] for s in segment]) for k in segment[0]})
  return unrolls


def _alive(network, frames):
  """Per conv layer: the fraction of channels active somewhere on some frame."""
  x, alive = to_float(frames), []
  for conv in network._torso._convs:  # pylint: disable=protected-access
    x = tf.nn.relu(conv(x))
    alive.append(float((x.numpy().reshape(-1, x.shape[-1]) > 0).any(0).mean()))
  return np.array(alive)


def test_registry_atari_settings_keep_the_torso_alive():
  unrolls = _random_play_unrolls()
  assert sum(int((u['reward'] != 0).sum()) for u in unrolls) > 10  # points were lost
  config = registry.make_builder('vtrace', 'atari', batch_size=8).config
  tf.random.set_seed(0)
  network = make_network(config.network, 6, config.hidden_sizes, config.lstm_size,
                         config.torso)
  frames = tf.constant(np.stack([u['observation'][0] for u in unrolls[::2]]))
  network(frames[:1], ())
  learner = VTraceLearner(network, config, None)
  convs = network._torso._convs  # pylint: disable=protected-access
  before_w = [c.w.numpy().copy() for c in convs]
  before = _alive(network, frames)
  rng = np.random.RandomState(1)
  for _ in range(200):
    idx = rng.choice(len(unrolls), config.batch_size, replace=False)
    learner.train_on({k: tf.constant(np.stack([unrolls[j][k] for j in idx]))
                      for k in unrolls[0]})
  after = _alive(network, frames)
  moved = [np.linalg.norm(c.w.numpy() - w) / np.linalg.norm(w)
           for c, w in zip(convs, before_w)]
  assert np.all(after >= 0.85 * before), (before, after)
  assert min(moved) > 0.005, moved
