"""Logical-device checks, run in a fresh process (`python placement_cases.py CASE...`).

The CPU can be split into logical devices only before TensorFlow first lists them, which
a pytest process running other tests has long done; so `test_placement.py` runs the
cases here in a process of their own (one for all of them: TensorFlow's import is most
of a case's time), which prints one JSON line: per case, what it found, or the error it
raised (so one case failing fails its own test only).
"""

import json
import sys
import traceback

import numpy as np

from seedacme.runtime.placement import split_cpu

split_cpu(4)

import tensorflow as tf  # noqa: E402  (after the split)

from seedacme.agents.ppo import PPOBuilder, PPOConfig  # noqa: E402
from seedacme.agents.ppo.learning import PPOLearner  # noqa: E402
from seedacme.agents.r2d2 import R2D2Builder, R2D2Config  # noqa: E402
from seedacme.agents.r2d2.learning import R2D2Learner  # noqa: E402
from seedacme.agents.vtrace import VTraceBuilder, VTraceConfig  # noqa: E402
from seedacme.learner.replicas import LearnerDevices, PolicySync  # noqa: E402
from seedacme.serving.tf_policy import inference_device  # noqa: E402
from seedacme.types import FIRST, MID, EnvSpec  # noqa: E402

SPEC = EnvSpec((6,), 'float32', 3)
LEARNER = ('/device:CPU:1', '/device:CPU:2')


def _batch(signature, batch_size, seed=0):
  rng = np.random.default_rng(seed)

  def fill(s):
    shape = (batch_size,) + tuple(s.shape)
    if s.dtype == tf.int8:  # step types: no episode ends, so no masked transitions
      x = np.full(shape, MID, np.int8)
      x[:, 0] = FIRST
      return tf.constant(x)
    if s.dtype.is_integer:
      return tf.constant(rng.integers(0, 3, shape).astype(s.dtype.as_numpy_dtype))
    return tf.constant(rng.normal(size=shape).astype(s.dtype.as_numpy_dtype))
  return tf.nest.map_structure(fill, signature)


def _vtrace_builder():
  return VTraceBuilder(VTraceConfig(unroll_length=5, batch_size=4, hidden_sizes=(16,),
                                    max_gradient_norm=None))


def _vtrace_learner(builder, network):
  from seedacme.agents.vtrace.learning import VTraceLearner  # pylint: disable=g-import-not-at-top
  return VTraceLearner(network, builder.config, None, builder.item_signature(SPEC))


def _vtrace(devices):
  builder = _vtrace_builder()
  with devices.activate():
    network = builder.make_networks(SPEC)
    learner = _vtrace_learner(builder, network)
  return builder, network, learner


def _values(variables):
  return [np.asarray(tf.convert_to_tensor(v)) for v in variables]


def _max_diff(a, b):
  """The largest difference between two networks' variables, in order."""
  return max(float(np.abs(x - y).max()) for x, y in zip(_values(a), _values(b)))


def devices_case():
  """Variables and the batch step land on the devices named."""
  builder, network, learner = _vtrace(LearnerDevices(LEARNER))
  with tf.device('/device:CPU:3'), inference_device('/device:CPU:3'):
    policy = builder.make_policy(builder.make_networks(SPEC), SPEC, 4, 4)
  step = policy.step(np.arange(4), np.zeros((4, 6), np.float32), np.ones(4, bool),
                     np.zeros(4, bool))
  traced = learner.warm_up()  # traced ahead, as the central node does
  learner.train_on(_batch(builder.item_signature(SPEC), 4))
  variable = network.trainable_variables[0]
  return {'learner_variable_devices': sorted(v.device for v in variable.values),
          'policy_device': policy.device, 'actions': step.action.tolist(),
          'traced_ahead': traced}


def mirrored_equals_single_case():
  """A learner step over 2 devices gives the single-device step's variables."""
  out = {}
  for name in ('vtrace', 'r2d2', 'ppo'):
    results = []
    for devices in (LearnerDevices(), LearnerDevices(LEARNER)):
      if name == 'vtrace':
        builder, network, learner = _vtrace(devices)
        batch = _batch(builder.item_signature(SPEC), 4)
        tf.random.set_seed(0)
        reference = results[0][1] if results else None
        if reference is not None:  # same initial weights as the single-device learner
          for v, value in zip(network.variables, reference):
            v.assign(value)
        before = _values(network.variables)
        metrics = learner.train_on(batch)
      elif name == 'ppo':
        builder = PPOBuilder(PPOConfig(unroll_length=5, batch_size=4, epochs=1,
                                       num_minibatches=1, normalize_advantages=False,
                                       max_gradient_norm=None, hidden_sizes=(16,)))
        with devices.activate():
          network = builder.make_networks(SPEC)
          learner = PPOLearner(network, builder.config, None, builder.item_signature(SPEC))
        if results:
          for v, value in zip(network.variables, results[0][1]):
            v.assign(value)
        before = _values(network.variables)
        metrics = learner.train_on(_batch(builder.item_signature(SPEC), 4))
      else:
        builder = R2D2Builder(R2D2Config(burn_in=2, trace_length=4, batch_size=4,
                                         hidden_sizes=(16,), lstm_size=8,
                                         max_gradient_norm=None))
        with devices.activate():
          networks = builder.make_networks(SPEC)
          learner = R2D2Learner(networks.online, networks.target, builder.config, None,
                                None, builder.table, builder.item_signature(SPEC))
        network = networks.online
        if results:
          for v, value in zip(network.variables, results[0][1]):
            v.assign(value)
          learner.update_target()
        before = _values(network.variables)
        info = _Info(4)
        metrics = learner.train_on(info, _batch(builder.item_signature(SPEC), 4))
      results.append((metrics, before, _values(network.variables)))
    (m1, b1, a1), (m2, b2, a2) = results
    out[name] = {
        'same_start': max(float(np.abs(x - y).max()) for x, y in zip(b1, b2)),
        'max_diff': max(float(np.abs(x - y).max()) for x, y in zip(a1, a2)),
        'moved': max(float(np.abs(x - y).max()) for x, y in zip(a1, b1)),
        'loss': [m1.get('loss'), m2.get('loss')]}
  return out


class _Info:
  """What R2D2's `train_on` reads of a Reverb sample's info, uniform priorities."""

  def __init__(self, n):
    self.probability = tf.fill([n], 1.0 / 100)
    self.table_size = tf.fill([n], tf.constant(100, tf.int64))
    self.key = tf.cast(tf.range(n), tf.uint64)


def sync_case():
  """Inference on its own device keeps serving while the learner steps, with
  parameters at most one learner step old."""
  builder, network, learner = _vtrace(LearnerDevices(LEARNER))
  with tf.device('/device:CPU:0'):
    inference_network = builder.make_networks(SPEC)
  with inference_device('/device:CPU:0'):
    policy = builder.make_policy(inference_network, SPEC, 4, 4)
  sync = PolicySync(network.variables, inference_network.variables)
  sync()
  stale, fresh, served = [], [], 0
  for step in range(3):
    learner.train_on(_batch(builder.item_signature(SPEC), 4, seed=step))
    # Before the copy the inference copy is exactly one step behind ...
    stale.append(_max_diff(inference_network.variables, network.variables))
    policy.step(np.arange(4), np.zeros((4, 6), np.float32), np.ones(4, bool),
                np.zeros(4, bool))
    served += 1
    sync()  # ... and equal after it
    fresh.append(_max_diff(inference_network.variables, network.variables))
  return {'stale': stale, 'fresh': fresh, 'served': served, 'copies': sync.copies}


def policy_copy_case():
  """One device for both: inference shares the learner's variables, or with
  `policy_copy` holds its own, equal after each copy and untouched by a learner step."""
  from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
  from seedacme.nodes.placed import place_networks  # pylint: disable=g-import-not-at-top
  builder = _vtrace_builder()
  shared = place_networks(builder, SPEC, ProgramConfig())
  placed = place_networks(builder, SPEC, ProgramConfig(policy_copy=True))
  learner = _vtrace_learner(builder, placed.learner)

  def diff():
    return _max_diff(placed.inference.variables, placed.learner.variables)
  placed.sync()
  after_copy = diff()
  learner.train_on(_batch(builder.item_signature(SPEC), 4))
  after_step = diff()
  placed.sync()
  return {'shared_same_objects': shared.inference is shared.learner,
          'shared_sync': shared.sync is not None,
          'copy_same_objects': placed.inference is placed.learner,
          'copy_placement_shared': placed.placement.shared,
          'after_copy': after_copy, 'after_step': after_step, 'after_next_copy': diff()}


def _run(name):
  try:
    return globals()[name + '_case']()
  except Exception:  # pylint: disable=broad-except  (reported to the case's test)
    return {'error': traceback.format_exc()}


if __name__ == '__main__':
  print(json.dumps({name: _run(name) for name in sys.argv[1:]}))
