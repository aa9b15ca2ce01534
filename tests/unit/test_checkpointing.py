"""Checkpoints keep everything trained (weights, optimizer state, counters); export works."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents import r2d2, vtrace
from seedacme.learner.checkpointing import Checkpointer, export_policy
from seedacme.types import EnvSpec

SPEC = EnvSpec((4,), 'float32', 3)


def _unroll_batch(rng, b=4, n=6, lstm=None):
  batch = {
      'observation': tf.constant(rng.normal(size=(b, n, 4)), tf.float32),
      'reward': tf.constant(rng.normal(size=(b, n)), tf.float32),
      'discount': tf.ones((b, n)),
      'step_type': tf.constant(np.ones((b, n)), tf.int8),
      'action': tf.constant(rng.integers(0, 3, (b, n)), tf.int32),
      'logits': tf.constant(rng.normal(size=(b, n, 3)), tf.float32),
  }
  if lstm:
    batch['initial_state'] = (tf.zeros((b, lstm)), tf.zeros((b, lstm)))
  return batch


def _vtrace_learner(core='lstm'):
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(core=core, lstm_size=8,
                                                     hidden_sizes=(8,), unroll_length=5))
  network = builder.make_networks(SPEC)
  return network, vtrace.learning.VTraceLearner(network, builder.config, batches=None)


def _flat(variables):
  return np.concatenate([v.numpy().ravel() for v in variables])


def test_restore_continues_training_exactly(tmp_path):
  rng = np.random.default_rng(0)
  batches = [_unroll_batch(rng, lstm=8) for _ in range(3)]
  network, learner = _vtrace_learner()
  for batch in batches[:2]:
    learner.train_on(batch)
  ckpt = Checkpointer(str(tmp_path), learner.checkpoint_state())
  ckpt.save({'learner_steps': 2, 'env_steps': 1234, 'episodes': 7})
  learner.train_on(batches[2])  # the run goes on after the checkpoint...

  network2, learner2 = _vtrace_learner()  # ... and a restarted node restores it
  assert not np.allclose(_flat(network2.variables), _flat(network.variables))
  counters = Checkpointer(str(tmp_path), learner2.checkpoint_state()).restore()
  assert counters == {'learner_steps': 2, 'env_steps': 1234, 'episodes': 7}
  assert int(learner2.num_steps.numpy()) == 2
  learner2.train_on(batches[2])
  # Same third step from the same weights AND Adam moments: identical parameters.
  np.testing.assert_allclose(_flat(network2.variables), _flat(network.variables), rtol=1e-5,
                             atol=1e-6)


def test_fresh_directory_restores_nothing(tmp_path):
  _, learner = _vtrace_learner('feedforward')
  assert Checkpointer(str(tmp_path / 'none'), learner.checkpoint_state()).restore() is None


def test_maybe_save_respects_interval(tmp_path):
  _, learner = _vtrace_learner('feedforward')
  ckpt = Checkpointer(str(tmp_path), learner.checkpoint_state(), interval_s=3600)
  assert ckpt.maybe_save({'learner_steps': 1}) is None
  assert ckpt.save({'learner_steps': 1}) and ckpt.saves == 1


@pytest.mark.parametrize('agent', ['vtrace_feedforward', 'vtrace_lstm', 'r2d2'])
def test_exported_policy_matches_network(tmp_path, agent):
  if agent == 'r2d2':
    builder = r2d2.R2D2Builder(r2d2.R2D2Config(lstm_size=8, hidden_sizes=(8,)))
  else:
    builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(
        core=agent.split('_')[1], lstm_size=8, hidden_sizes=(8,)))
  network = builder.policy_network(builder.make_networks(SPEC))
  path = export_policy(network, SPEC, str(tmp_path / 'saved_model'))
  loaded = tf.saved_model.load(path)
  obs = tf.constant(np.random.default_rng(1).normal(size=(5, 4)), tf.float32)
  state = loaded.initial_state(tf.constant(5))
  out, _ = loaded.step(obs, state)
  expected, _ = network(obs, network.initial_state(5))
  tf.nest.map_structure(lambda a, b: np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5),
                        out, expected)
