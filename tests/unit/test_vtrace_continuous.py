"""V-trace with continuous actions, through the shared action head (seedacme/distributions).

The server samples inside the env's bounds and stores the raw sample and its
log-probability; on data the learner's own parameters produced, the importance ratios
are exactly 1 (the learner scores the stored raw sample, no inverse tanh); the running
observation normalizer is updated by the learner step.
"""

import numpy as np
import tensorflow as tf

from seedacme.agents.vtrace import VTraceBuilder, VTraceConfig
from seedacme.agents.vtrace.learning import VTraceLearner
from seedacme.types import FIRST, MID, EnvSpec

SPEC = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -2.0), (1.0, 0.5))


def test_on_policy_unrolls_have_ratio_one_and_actions_stay_in_bounds():
  config = VTraceConfig(unroll_length=6, batch_size=4, hidden_sizes=(16,),
                        normalize_observations=False, learning_rate=0.0)
  builder = VTraceBuilder(config)
  network = builder.make_networks(SPEC)
  signature = builder.item_signature(SPEC)
  assert 'logits' not in signature
  assert signature['raw_action'].shape == (7, 2) and signature['log_prob'].shape == (7,)
  policy = builder.make_policy(network, SPEC, 4, 4)
  rng = np.random.default_rng(0)
  steps = []
  for t in range(7):  # four envs acting for seven steps: one unroll each
    observation = rng.normal(size=(4, 5)).astype(np.float32)
    out = policy.step(np.arange(4), observation, np.full(4, t == 0), np.zeros(4, bool))
    assert (out.action >= [-1.0, -2.0]).all() and (out.action <= [1.0, 0.5]).all()
    steps.append((observation, out))
  step_type = np.full((4, 7), MID, np.int8)
  step_type[:, 0] = FIRST
  batch = {
      'observation': tf.constant(np.stack([o for o, _ in steps], 1)),
      'reward': tf.constant(rng.normal(size=(4, 7)).astype(np.float32)),
      'discount': tf.ones((4, 7)), 'step_type': tf.constant(step_type),
      'action': tf.constant(np.stack([s.action for _, s in steps], 1)),
      'raw_action': tf.constant(np.stack([s.extras['raw_action'] for _, s in steps], 1)),
      'log_prob': tf.constant(np.stack([s.extras['log_prob'] for _, s in steps], 1)),
  }
  metrics = VTraceLearner(network, config, None, signature).train_on(batch)
  assert abs(metrics['mean_rho'] - 1.0) < 1e-4, metrics  # the same policy scored it


def test_the_learner_step_updates_the_observation_statistics():
  config = VTraceConfig(unroll_length=4, batch_size=2, hidden_sizes=(8,),
                        normalize_observations=True)
  builder = VTraceBuilder(config)
  network = builder.make_networks(SPEC)
  signature = builder.item_signature(SPEC)
  rng = np.random.default_rng(1)
  batch = {k: (tf.constant(np.full((2,) + tuple(s.shape), MID, np.int8))
               if k == 'step_type' else
               tf.constant(rng.normal(3.0, size=(2,) + tuple(s.shape)).astype(
                   s.dtype.as_numpy_dtype)))
           for k, s in signature.items()}
  VTraceLearner(network, config, None, signature).train_on(batch)
  assert network.normalizer.count.numpy() == 2 * 4  # T transitions of both unrolls
  assert np.all(network.normalizer.mean.numpy() > 1.0)  # moved toward the data's 3
