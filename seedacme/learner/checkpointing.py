"""Checkpoints of the central node, resume, and policy export.

What a restart must not lose lives on the central node: network variables, optimizer
state and the step counters. `Checkpointer` saves them with `tf.train.CheckpointManager`
under `<logdir>/checkpoints/` every `interval_s` and once more at shutdown; starting the
same command with the same logdir restores the latest checkpoint, so the learner
continues at the step it had reached. Reverb's queue/replay may restart empty.
Checkpoints and the exported policy go through TensorFlow's file systems, so the
logdir may be a bucket (`gs://...` on Vertex AI).

A resume restores the same run or refuses to start:
- the run's config is saved beside the first checkpoint and compared before a restore
  (`seedacme.run.identity`); a checkpoint saved without one is refused too (on
  ce34d39 it was restored and the new config adopted) unless
  `--allow_config_change '*'` adopts this run's;
- a restore must match every saved object both ways, or it fails naming what is
  missing (`CheckpointMismatchError`). TF's `expect_partial()` skipped whatever did not
  match: a net with one hidden layer restored the first of a two-layer net's and went
  on. Optimizer state is created at the first update and restored then, so only it may
  stay unmatched at restore time.
- until that first update no checkpoint is saved: TF reads the optimizer's values from
  the restored checkpoint's files when it creates them, and `max_to_keep` saves at the
  same learner step would delete those files (seen under load: three saves in 10 s of
  tracing, then `NotFoundError ... ckpt-5` at the first update killed the central node
  a second time); the saves would also lack the optimizer state. What such a save
  would add is only the env steps and episodes since the restore.
"""

import os
import time
import uuid
from typing import Any, Callable, Dict, Sequence

from absl import logging
import tensorflow as tf
import tree

from seedacme.run import identity as identity_lib
from seedacme.types import EnvSpec

COUNTERS = ('learner_steps', 'env_steps', 'episodes')


class CheckpointMismatchError(RuntimeError):
  """A checkpoint whose saved objects and the program's do not match one to one."""

  fatal = True  # a supervisor does not restart it (see seedacme.runtime.supervisor)


# Keys of a checkpoint that are not the state's own objects.
_BOOKKEEPING = ('_CHECKPOINTABLE_OBJECT_GRAPH', 'save_counter/')


def _keys(path: str) -> set:
  reader = tf.compat.v1.train.NewCheckpointReader(path)
  return {k for k in reader.get_variable_to_shape_map() if not k.startswith(_BOOKKEEPING)}


def _is_optimizer(value: Any) -> bool:
  import sonnet as snt  # pylint: disable=g-import-not-at-top
  return isinstance(value, (snt.Optimizer, tf.keras.optimizers.Optimizer))


def _listing(keys: set, limit: int = 8) -> str:
  names = sorted(k.replace('/.ATTRIBUTES/VARIABLE_VALUE', '') for k in keys)
  more = f' and {len(names) - limit} more' if len(names) > limit else ''
  return ', '.join(names[:limit]) + more


class Checkpointer:
  """Periodic checkpoints of trackable learner state plus progress counters.

  `identity` (`seedacme.run.identity.run_identity`): the run's config, saved beside
  the first checkpoint and compared at a restore (None: not saved nor compared);
  `allow_changes` the fields a restore may find changed; `log_event` tells the run's
  progress log about a refusal or an allowed change.
  """

  def __init__(self, directory: str, state: Dict[str, Any], interval_s: float = 60.0,
               max_to_keep: int = 3, identity: Dict[str, Any] | None = None,
               allow_changes: Sequence[str] = (),
               log_event: Callable[[str], None] | None = None):
    self._counters = {name: tf.Variable(0, dtype=tf.int64, name=name) for name in COUNTERS}
    self._state = state
    self._checkpoint = tf.train.Checkpoint(**state, **self._counters)
    self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep)
    self._directory = directory
    self._interval_s = interval_s
    self._last_save = time.monotonic()
    self._identity = identity
    self._allow_changes = tuple(allow_changes)
    self._log_event = log_event or (lambda message: None)
    self._identity_saved = False
    self.saves = 0
    self.skipped = 0  # saves not made while the restore was pending
    # Keys of the restored checkpoint whose objects the program has not created yet
    # (optimizer state, made at the first update): no save until they exist.
    self._awaited: set = set()
    self._awaited_from = ''

  def _expected_keys(self) -> set:
    """The keys a checkpoint of the current state has (written to memory: `ram://`)."""
    probe = self._checkpoint.write(f'ram://seedacme_checkpoint_probe/{uuid.uuid4().hex}')
    try:
      return _keys(probe)
    finally:
      for path in tf.io.gfile.glob(probe + '*'):
        tf.io.gfile.remove(path)

  def _restore_matching(self, path: str) -> None:
    """Restores `path`, or raises `CheckpointMismatchError` naming what does not match."""
    expected = self._expected_keys()
    saved = _keys(path)
    # Optimizer state not created yet (the first update creates it and the deferred
    # restore fills it then): only that may be in the checkpoint and not in the program.
    lazy = tuple(f'{name}/' for name, value in self._state.items() if _is_optimizer(value))
    extra = {k for k in saved - expected
             if not k.startswith(lazy) and '/.OPTIMIZER_SLOT/' not in k}  # Keras slots
    missing = expected - saved
    problems = []
    if missing:
      problems.append(f'the program has {len(missing)} objects the checkpoint lacks '
                      f'({_listing(missing)})')
    if extra:
      problems.append(f'the checkpoint has {len(extra)} objects the program lacks '
                      f'({_listing(extra)})')
    if not problems:
      self._awaited, self._awaited_from = saved - expected, path
      try:
        self._checkpoint.restore(path).assert_existing_objects_matched()
      except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        problems.append(str(e).splitlines()[0])  # e.g. a shape that differs
    if problems:
      raise CheckpointMismatchError(
          f'checkpoint {path} does not match this program: {"; ".join(problems)}. A '
          'resume restores every saved object or none (another network or agent '
          'config needs another --logdir)')

  def restore(self, prefer: Callable[[int], bool] | None = None) -> Dict[str, int] | None:
    """Restores the latest checkpoint -- or, given `prefer`, the newest whose learner
    steps it accepts, if any (a reproducible run: one it can resume exactly from);
    returns its counters (None: fresh start).

    Raises `RunConfigMismatchError` (another run's config) or `CheckpointMismatchError`
    (objects that do not match: found before any variable changes; a shape that
    differs, while restoring). Both are fatal: the program stops, unrestarted."""
    path = self._manager.latest_checkpoint
    if path is None:
      return None
    if prefer is not None:
      latest = path
      for candidate in reversed(self._manager.checkpoints):
        steps = saved_learner_steps(candidate)
        if prefer(steps):
          path = candidate
          break
      if path != latest:
        self._log_event(f'resuming from {os.path.basename(path)} (learner step {steps}), '
                        'the newest this run continues exactly from, not the latest '
                        f'{os.path.basename(latest)}')
    changes = []
    if self._identity is not None:
      try:
        changes = identity_lib.check_resume(self._directory, self._identity,
                                            self._allow_changes)
      except identity_lib.RunConfigMismatchError as e:
        self._log_event(str(e))
        raise
    try:
      self._restore_matching(path)
    except CheckpointMismatchError as e:
      self._log_event(str(e))
      raise
    counters = {k: int(v.numpy()) for k, v in self._counters.items()}
    logging.info('Restored checkpoint %s at learner step %d', path, counters['learner_steps'])
    if self._identity is not None:
      if identity_lib.read_saved(self._directory) is None:  # adopted: '*' allowed it
        self._log_event('resumed a checkpoint saved without its run config (allowed: '
                        "--allow_config_change '*'): this run's config from now on")
      elif changes:
        self._log_event('resumed with a changed config (allowed): ' + '; '.join(
            f'{k}: {a!r} -> {b!r}' for k, a, b in changes))
      if changes:
        identity_lib.save(self._directory, self._identity, change=identity_lib.change_record(
            counters['learner_steps'], changes))
      self._identity_saved = True
    return counters

  def restore_pending(self) -> bool:
    """Whether the restored checkpoint still holds values the program has not created
    (optimizer state before the first update). Checked by writing the state to memory
    (`ram://`), only until they exist."""
    if self._awaited:
      self._awaited -= self._expected_keys()
      if not self._awaited:
        logging.info('Checkpoint %s fully restored (optimizer state too): saving again',
                     self._awaited_from)
    return bool(self._awaited)

  def save(self, counters: Dict[str, int]) -> str | None:
    """Saves the state and `counters`; the path, or None while the restore is pending
    (`restore_pending`: the restored checkpoint stays the latest)."""
    if self.restore_pending():
      if not self.skipped:
        logging.info('Checkpoint not saved: %d values of %s are restored at the '
                     "learner's first update, which has not come (it stays the latest)",
                     len(self._awaited), self._awaited_from)
      self.skipped += 1
      self._last_save = time.monotonic()
      return None
    for name, value in counters.items():
      if name in self._counters:
        self._counters[name].assign(int(value))
    if self._identity is not None and not self._identity_saved:
      # Beside the first checkpoint, before it: a checkpoint never lacks its config
      # (a config left by a run killed before its first checkpoint is replaced here).
      identity_lib.save(self._directory, self._identity, fresh=True)
      self._identity_saved = True
    path = self._manager.save()
    self._last_save = time.monotonic()
    self.saves += 1
    return path

  def due(self) -> bool:
    """Whether `interval_s` has passed since the last save."""
    return time.monotonic() - self._last_save >= self._interval_s


def saved_learner_steps(path: str) -> int:
  """The learner steps a checkpoint holds, read without restoring it."""
  return int(tf.train.load_checkpoint(path).get_tensor(
      'learner_steps/.ATTRIBUTES/VARIABLE_VALUE'))


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
