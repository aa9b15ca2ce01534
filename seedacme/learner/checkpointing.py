"""Checkpoints of the central node, resume, and policy export.

What a restart must not lose lives on the central node: network variables, optimizer
state and the step counters. `Checkpointer` saves them with `tf.train.CheckpointManager`
under `<logdir>/checkpoints/` every `interval_s` and once more at shutdown; starting the
same command with the same logdir restores the latest checkpoint, so the learner
continues at the step it had reached. Reverb's queue/replay may restart empty.
Checkpoints and the exported policy go through TensorFlow's file systems, so the
logdir may be a bucket (`gs://...` on Vertex AI).
"""

import os
import time
from typing import Any, Dict

from absl import logging
import tensorflow as tf
import tree

from seedacme.types import EnvSpec

COUNTERS = ('learner_steps', 'env_steps', 'episodes')


class Checkpointer:
  """Periodic checkpoints of trackable learner state plus progress counters."""

  def __init__(self, directory: str, state: Dict[str, Any], interval_s: float = 60.0,
               max_to_keep: int = 3):
    self._counters = {name: tf.Variable(0, dtype=tf.int64, name=name) for name in COUNTERS}
    self._checkpoint = tf.train.Checkpoint(**state, **self._counters)
    self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep)
    self._interval_s = interval_s
    self._last_save = time.monotonic()
    self.saves = 0

  def restore(self) -> Dict[str, int] | None:
    """Restores the latest checkpoint; returns its counters (None: fresh start)."""
    path = self._manager.latest_checkpoint
    if path is None:
      return None
    # Optimizer slots are created at the first update and restored then (deferred).
    self._checkpoint.restore(path).expect_partial()
    counters = {k: int(v.numpy()) for k, v in self._counters.items()}
    logging.info('Restored checkpoint %s at learner step %d', path, counters['learner_steps'])
    return counters

  def save(self, counters: Dict[str, int]) -> str:
    for name, value in counters.items():
      if name in self._counters:
        self._counters[name].assign(int(value))
    path = self._manager.save()
    self._last_save = time.monotonic()
    self.saves += 1
    return path

  def maybe_save(self, counters: Dict[str, int]) -> str | None:
    """Saves if `interval_s` has passed since the last save."""
    if time.monotonic() - self._last_save < self._interval_s:
      return None
    return self.save(counters)


class _ExportedPolicy(tf.Module):
  """The acting network as a SavedModel: `initial_state(batch_size)` and `step`."""

  def __init__(self, network, spec: EnvSpec):
    super().__init__(name='seedacme_policy')
    self.network = network
    state = network.initial_state(1)
    state_spec = tree.map_structure(lambda x: tf.TensorSpec([None] + x.shape[1:], x.dtype),
                                    state)
    obs_spec = tf.TensorSpec([None, *spec.observation_shape], tf.as_dtype(spec.dtype))
    self.step = tf.function(lambda observation, state: self.network(observation, state),
                            input_signature=[obs_spec, state_spec])
    self.initial_state = tf.function(
        lambda batch_size: self.network.initial_state(batch_size),
        input_signature=[tf.TensorSpec([], tf.int32)])


def export_policy(network, spec: EnvSpec, path: str) -> str:
  """Writes the acting network as a SavedModel (`step(observation, state)`)."""
  tf.io.gfile.makedirs(os.path.dirname(path) or '.')  # gs:// too
  tf.saved_model.save(_ExportedPolicy(network, spec), path)
  return path
