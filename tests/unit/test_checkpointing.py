"""Checkpoints keep everything trained (weights, optimizer state, counters); export works."""

import numpy as np
import pytest
import tensorflow as tf

from seedacme.agents import r2d2, vtrace
from seedacme.agents.vtrace import learning as vtrace_learning
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
  return network, vtrace_learning.VTraceLearner(network, builder.config, batches=None)


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


def test_a_save_is_due_only_after_its_interval(tmp_path):
  _, learner = _vtrace_learner('feedforward')
  ckpt = Checkpointer(str(tmp_path), learner.checkpoint_state(), interval_s=3600)
  assert not ckpt.due()
  assert ckpt.save({'learner_steps': 1}) and ckpt.saves == 1
  assert Checkpointer(str(tmp_path / 'b'), learner.checkpoint_state(), interval_s=0).due()


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


# ---- a restore matches every saved object, or fails naming what does not match ------
CATCH = EnvSpec((10, 5), 'float32', 3)


def _catch_learner(train=True, **config):
  """A real V-trace learner on Catch's spec, trained one step (so that its optimizer
  state, which Sonnet creates at the first update, is in its checkpoints) or fresh."""
  # The LSTM as wide as the MLP's last layer: the heads' shapes agree whichever core,
  # as with Catch's defaults (64 and 64), where expect_partial() restored the one into
  # the other without a word.
  config = {'hidden_sizes': (16,), 'lstm_size': 16, **config}
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                     **config))
  network = builder.make_networks(CATCH)
  learner = vtrace_learning.VTraceLearner(network, builder.config, batches=None)
  rng = np.random.default_rng(0)
  batch = {k: (tf.nest.map_structure(lambda s: tf.zeros((4,) + tuple(s.shape), s.dtype), v)
               if k == 'initial_state' else
               tf.constant(rng.normal(size=(4,) + tuple(v.shape)).astype(
                   v.dtype.as_numpy_dtype)) if v.dtype.is_floating else
               tf.ones((4,) + tuple(v.shape), v.dtype))
           for k, v in builder.item_signature(CATCH).items()}
  if train:
    learner.train_on(batch)
  return network, learner, batch


@pytest.mark.parametrize('saved, resumed, named', [
    (dict(core='feedforward'), dict(core='lstm'), 'lacks'),
    (dict(core='lstm'), dict(core='feedforward'), 'lacks'),
    # Only layer 1 differs: expect_partial() restored layer 0 and the head and dropped
    # the second layer without a word.
    (dict(hidden_sizes=(16, 16)), dict(hidden_sizes=(16,)), 'the checkpoint has'),
    (dict(hidden_sizes=(16,)), dict(hidden_sizes=(16, 16)), 'the program has'),
    (dict(normalize_observations=True), dict(), 'the checkpoint has'),
    (dict(hidden_sizes=(16,)), dict(hidden_sizes=(32,)), 'Shapes'),
])
def test_a_restore_into_another_network_fails_naming_what_does_not_match(
    tmp_path, saved, resumed, named):
  _, learner, _ = _catch_learner(**saved)
  Checkpointer(str(tmp_path), learner.checkpoint_state()).save(
      {'learner_steps': 1, 'env_steps': 10, 'episodes': 1})
  network, other, _ = _catch_learner(train=False, **resumed)
  before = _flat(network.variables)
  with pytest.raises(RuntimeError, match='does not match this program') as raised:
    Checkpointer(str(tmp_path), other.checkpoint_state()).restore()
  assert named in str(raised.value)
  assert getattr(raised.value, 'fatal', False)  # the supervisor does not retry it
  if named != 'Shapes':  # refused before any variable changed
    np.testing.assert_array_equal(_flat(network.variables), before)


@pytest.mark.parametrize('config', [dict(core='feedforward'), dict(core='lstm'),
                                    dict(normalize_observations=True)])
def test_a_matching_restore_of_a_trained_learner_passes_with_its_optimizer_state(
    tmp_path, config):
  network, learner, batch = _catch_learner(**config)
  Checkpointer(str(tmp_path), learner.checkpoint_state()).save(
      {'learner_steps': 1, 'env_steps': 10, 'episodes': 1})
  network2, learner2, _ = _catch_learner(train=False, **config)  # no optimizer state yet
  assert Checkpointer(str(tmp_path), learner2.checkpoint_state()).restore()
  np.testing.assert_array_equal(_flat(network2.variables), _flat(network.variables))
  learner.train_on(batch)  # the same next step: the moments came back at the first one
  learner2.train_on(batch)
  np.testing.assert_allclose(_flat(network2.variables), _flat(network.variables), rtol=1e-5,
                             atol=1e-6)


def test_other_agents_learners_restore_their_own_trained_checkpoints(tmp_path):
  """PPO (normalizer, reward statistics) and SAC (three optimizers) after an update."""
  from seedacme.agents import ppo, sac  # pylint: disable=g-import-not-at-top
  from seedacme.agents.ppo import learning as ppo_learning  # pylint: disable=g-import-not-at-top
  from seedacme.agents.sac import learning as sac_learning  # pylint: disable=g-import-not-at-top
  continuous = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -2.0), (1.0, 0.5))

  def sac_learner(train=True):
    config = sac.SACConfig(batch_size=8, min_replay_size=8, hidden_sizes=(16,))
    builder = sac.SACBuilder(config)
    nets = builder.make_networks(continuous)
    learner = sac_learning.SACLearner(nets, config, None, builder.item_signature(continuous),
                                      builder.layout(continuous))
    rng = np.random.default_rng(0)
    batch = {'observation': tf.constant(rng.normal(size=(8, 2, 5)).astype(np.float32)),
             'reward': tf.ones((8, 2)), 'discount': tf.ones((8, 2)),
             'step_type': tf.ones((8, 2), tf.int8),
             'raw_action': tf.constant(rng.normal(size=(8, 2, 2)).astype(np.float32))}
    if train:
      learner.train_on(batch)
    return learner, batch

  def ppo_learner(train=True):
    config = ppo.PPOConfig(unroll_length=5, batch_size=4, num_minibatches=2,
                           normalize_observations=True, hidden_sizes=(8,))
    builder = ppo.PPOBuilder(config)
    network = builder.make_networks(continuous)
    signature = builder.item_signature(continuous)
    learner = ppo_learning.PPOLearner(network, config, None, signature)
    batch = {k: tf.ones((4,) + tuple(s.shape), s.dtype) for k, s in signature.items()}
    if train:
      learner.train_on(batch)
    return learner, batch

  for i, make in enumerate((sac_learner, ppo_learner)):
    directory = str(tmp_path / str(i))
    Checkpointer(directory, make()[0].checkpoint_state()).save({'learner_steps': 1})
    learner, batch = make(train=False)
    ckpt = Checkpointer(directory, learner.checkpoint_state())
    assert ckpt.restore()
    # The optimizers' state waits for the first update, and then every saved value has
    # its variable: saving resumes (a name that never matched would stop it for good).
    assert ckpt.restore_pending()
    learner.train_on(batch)
    assert not ckpt.restore_pending()


def test_no_save_before_the_first_update_after_a_restore_keeps_its_optimizer_state(tmp_path):
  """The optimizer's values are read from the restored checkpoint's files at the first
  update: saves before it (max_to_keep=3, four of them) would delete those files, the
  update then failed with NotFoundError and killed the central node. They are skipped
  until the update; then the moments are the saved ones and saving resumes."""
  network, learner, batch = _catch_learner()
  Checkpointer(str(tmp_path), learner.checkpoint_state()).save(
      {'learner_steps': 1, 'env_steps': 10, 'episodes': 1})
  restored_path = tf.train.latest_checkpoint(str(tmp_path))
  network2, learner2, _ = _catch_learner(train=False)
  ckpt = Checkpointer(str(tmp_path), learner2.checkpoint_state(), max_to_keep=3)
  assert ckpt.restore() and ckpt.restore_pending()
  for step in range(4):
    assert ckpt.save({'learner_steps': 1, 'env_steps': 20 + step}) is None
  assert ckpt.skipped == 4 and ckpt.saves == 0
  assert tf.train.latest_checkpoint(str(tmp_path)) == restored_path
  learner.train_on(batch)
  learner2.train_on(batch)  # reads the moments from the kept files
  np.testing.assert_allclose(_flat(network2.variables), _flat(network.variables), rtol=1e-5,
                             atol=1e-6)
  assert not ckpt.restore_pending()
  path = ckpt.save({'learner_steps': 2, 'env_steps': 30})
  assert path and path != restored_path and ckpt.saves == 1


def test_a_restore_with_every_value_matched_saves_at_once(tmp_path):
  network, learner, _ = _catch_learner(train=False)  # saved before any update
  Checkpointer(str(tmp_path), learner.checkpoint_state()).save({'learner_steps': 0})
  _, learner2, _ = _catch_learner(train=False)
  ckpt = Checkpointer(str(tmp_path), learner2.checkpoint_state())
  assert ckpt.restore() is not None and not ckpt.restore_pending()
  assert ckpt.save({'learner_steps': 0}) and ckpt.saves == 1
