"""The learner's devices: one, or several data-parallel (tf.distribute), behind one call.

An agent writes its SGD step once, for one replica: compute gradients on its share of
the batch, `all_reduce_mean` them (the identity on one device), clip, apply. The
central node activates the learner's devices around `make_networks` and `make_learner`
(`LearnerDevices.activate`); a learner takes `current()` and runs its step through
`run`. On several devices that is Sonnet's `Replicator` (MirroredStrategy whose
variables are replica-local copies kept equal by the all-reduced updates): the batch is
split in equal contiguous parts, one per device; scalar outputs (metrics) come back
averaged, per-item outputs (R2D2's priorities) concatenated in batch order.

A batch's mean loss split in equal parts gives the same gradient as on one device when
every part's loss is a mean over the same number of terms (no masked transitions);
with masks the parts' means are weighted alike rather than by their counts.
"""

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

import sonnet as snt
import tensorflow as tf
import tree

_local = threading.local()


def all_reduce_mean(values: Any) -> Any:
  """The mean over replicas of a nest of tensors (the values themselves on one device)."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return values
  return context.all_reduce(tf.distribute.ReduceOp.MEAN, values)


class LearnerDevices:
  """One device (or the default placement), or a `Replicator` over several."""

  def __init__(self, devices: Sequence[str] = ()):
    self.devices = tuple(devices)
    self.strategy = (snt.distribute.Replicator(devices=list(self.devices))
                     if len(self.devices) > 1 else None)

  @property
  def num_replicas(self) -> int:
    return max(1, len(self.devices))

  @contextlib.contextmanager
  def activate(self) -> Iterator['LearnerDevices']:
    """Variables created inside live on these devices; `current()` returns self."""
    previous = getattr(_local, 'devices', None)
    _local.devices = self
    try:
      if self.strategy is not None:
        with self.strategy.scope():
          yield self
      elif self.devices:
        with tf.device(self.devices[0]):
          yield self
      else:
        yield self
    finally:
      _local.devices = previous

  def build_optimizer(self, optimizer: snt.Optimizer, module: snt.Module):
    """Creates a Sonnet optimizer's slots for `module`'s trainable variables now,
    eagerly, on these devices (one device: nothing to do). Created in a
    traced step instead (its first `apply`), the replicas' copies cannot be
    initialized (TF 2.8: `UnliftableError` when the step is traced ahead, `warm_up`)."""
    if self.strategy is None:
      return
    initialize = getattr(optimizer, '_initialize', None)  # Sonnet's `snt.once` slots
    if initialize is None:
      raise TypeError(f'{type(optimizer).__name__} has no _initialize: cannot create its '
                      'slots before a multi-device step')
    with self.strategy.scope():
      initialize(list(module.trainable_variables))

  def run(self, fn: Callable[..., Any], *args, shared: tuple = ()) -> Any:
    """`fn(*shared, *args)` on one device, or on each replica with its part of `args`
    (split along the first axis; `shared` goes whole to every replica); call it inside
    a `tf.function`."""
    if self.strategy is None:
      if self.devices:
        with tf.device(self.devices[0]):
          return fn(*shared, *args)
      return fn(*shared, *args)
    n = self.num_replicas

    def replica_fn(*full):
      i = tf.distribute.get_replica_context().replica_id_in_sync_group

      def part(x):
        size = tf.shape(x)[0] // n
        return x[i * size:(i + 1) * size]
      return fn(*shared, *tree.map_structure(part, full))

    per_replica = self.strategy.run(replica_fn, args=args)

    def gather(value):
      parts = self.strategy.experimental_local_results(value)
      if parts[0].shape.rank == 0:
        return tf.add_n([tf.cast(p, tf.float32) for p in parts]) / len(parts) \
            if parts[0].dtype.is_floating else parts[0]
      return tf.concat(parts, axis=0)
    return tree.map_structure(gather, per_replica)


def current() -> LearnerDevices:
  """The devices the central node activated for the learner (one default device if
  none were: a learner built outside a central node, as in tests)."""
  return getattr(_local, 'devices', None) or LearnerDevices()


class PolicySync:
  """Copies the learner's policy variables into inference's copy on another device.

  Called after every learner step (`LearnerLoop(after_step=...)`), so inference acts
  with parameters at most one learner step old. A batch step running during the copy
  may see some layers already updated: SEED's inference copy has the same property.
  """

  def __init__(self, source: Sequence[tf.Variable], target: Sequence[tf.Variable]):
    if len(source) != len(target):
      raise ValueError(f'{len(source)} learner variables but {len(target)} inference ones')
    self._pairs = list(zip(source, target))
    self.copies = 0
    self._copy = tf.function(self._copy_all)

  def _copy_all(self):
    for src, dst in self._pairs:
      dst.assign(tf.convert_to_tensor(src))

  def __call__(self) -> None:
    self._copy()
    self.copies += 1
