"""The R2D2 learner step: prioritized sequences -> burn-in -> n-step double-Q -> Adam,
then new priorities back to Reverb and a periodic target-network copy.

Reverb 0.7's `mutate_priorities` takes no timeout, and a replay server that stops
answering (a hung or stopped process, a network partition) would block the learner
in it for good. The update therefore runs on a worker thread that the learner waits
for at most `PRIORITY_UPDATE_TIMEOUT_S`: past that, its priorities count as lost, as
during an outage, and while that call stays hung the next updates are counted lost
at once rather than started (at most one call outstanding, no pile of hung threads).
"""

import threading
from typing import Any, Dict

from absl import logging
import numpy as np
import sonnet as snt
import tensorflow as tf

from seedacme.agents.r2d2 import losses
from seedacme.agents.r2d2.config import R2D2Config
from seedacme.types import FIRST, LAST
from seedacme.learner import fused, replicas
from seedacme.learner.base import Learner
from seedacme.trajectories.datasets import ReverbBatches, batch_specs, time_major
from seedacme.trajectories.reverb_errors import is_server_away, server_answers

# How long the learner waits for one priority update (module docstring): far above a
# healthy update's milliseconds, short against a learner stuck for good.
PRIORITY_UPDATE_TIMEOUT_S = 10.0



def importance_weights(probabilities: tf.Tensor, table_size: tf.Tensor,
                       exponent: float) -> tf.Tensor:
  """(N p_i)^-beta, normalised by the batch maximum (Schaul et al., 2016)."""
  w = tf.pow(tf.cast(table_size, tf.float64) * tf.cast(probabilities, tf.float64), -exponent)
  return tf.cast(w / tf.reduce_max(w), tf.float32)


def sequence_loss(network: snt.Module, target_network: snt.Module,
                  batch: Dict[str, tf.Tensor], weights: tf.Tensor, config: R2D2Config):
  """Loss and priorities of a batch of sequences (batch-major, as stored in Reverb)."""
  observation = time_major(batch['observation'])
  step_type = time_major(batch['step_type'])
  first = tf.equal(step_type, FIRST)
  state = batch['initial_state']
  target_state = state
  b = config.burn_in
  if b:
    # Burn-in: refresh the stored (stale) state; no gradient flows through it.
    _, state = network.unroll(observation[:b], first[:b], state)
    _, target_state = target_network.unroll(observation[:b], first[:b], target_state)
    state = tf.nest.map_structure(tf.stop_gradient, state)
  online_q, _ = network.unroll(observation[b:], first[b:], state)
  target_q, _ = target_network.unroll(observation[b:], first[b:], target_state)
  rewards = tf.cast(time_major(batch['reward'])[b + 1:], tf.float32)
  if config.reward_clip is not None:
    rewards = tf.clip_by_value(rewards, -config.reward_clip, config.reward_clip)
  discounts = config.discount * tf.cast(time_major(batch['discount'])[b + 1:], tf.float32)
  mask = tf.not_equal(step_type[b:-1], LAST)
  actions = time_major(batch['action'])[b:-1]
  return losses.r2d2_loss(online_q, tf.stop_gradient(target_q), actions, rewards, discounts,
                          mask, weights, config.n_step, config.priority_eta,
                          config.value_rescaling_epsilon)


class R2D2Learner(Learner):
  """SGD on prioritized sequences; shares `network` with the inference server."""

  def __init__(self, network: snt.Module, target_network: snt.Module, config: R2D2Config,
               batches: ReverbBatches | None, replay_client=None, table: str = '',
               item_signature: Dict[str, Any] | None = None,
               priority_timeout_s: float = PRIORITY_UPDATE_TIMEOUT_S):
    """`item_signature` (one sequence's specs) lets `warm_up` trace the step early;
    `priority_timeout_s`: the longest wait for one priority update."""
    self._network = network
    self._item_signature = item_signature
    self._target_network = target_network
    self._config = config
    self._batches = batches
    self._client = replay_client
    self._table = table
    self._optimizer = snt.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
    self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.priority_updates = 0
    self.priority_updates_lost = 0
    self.priority_update_timeouts = 0
    self._priorities_failing = False
    self._priority_timeout_s = priority_timeout_s
    self._priority_call: threading.Thread | None = None  # the one that timed out
    self._devices = replicas.current()  # one device, or data-parallel over several
    self._devices.build_optimizer(self._optimizer, network)
    self.steps_per_call = config.sgd_steps_per_sample
    self._train = tf.function(
        lambda batch, weights: self._devices.run(self._train_step, batch, weights),
        experimental_relax_shapes=True)
    self.update_target()

  def checkpoint_state(self) -> Dict[str, Any]:
    return {'network': self._network, 'target_network': self._target_network,
            'optimizer': self._optimizer, 'num_steps': self.num_steps}

  def resume_state(self) -> Dict[str, Any]:
    """The priority-update counters the metrics carry (not checkpointed variables)."""
    return {'priority_updates': self.priority_updates,
            'priority_updates_lost': self.priority_updates_lost,
            'priority_update_timeouts': self.priority_update_timeouts}

  def load_resume_state(self, state: Dict[str, Any]) -> None:
    for name in ('priority_updates', 'priority_updates_lost', 'priority_update_timeouts'):
      setattr(self, name, int(state.get(name, getattr(self, name))))

  def update_target(self) -> None:
    for target, source in zip(self._target_network.variables, self._network.variables):
      target.assign(source)

  def _train_step(self, batch, weights):
    """One replica's part of the step (the whole step on one device); priorities per
    sequence come back concatenated in batch order (`LearnerDevices.run`)."""
    with tf.GradientTape() as tape:
      loss, priorities, metrics = sequence_loss(self._network, self._target_network, batch,
                                                weights, self._config)
    variables = self._network.trainable_variables
    grads = replicas.all_reduce_mean(tape.gradient(loss, variables))
    # The gradient's size per parameter, to read against Adam's epsilon (below it,
    # epsilon rather than the gradient's scale sets the step: docs/atari.md).
    norm = tf.linalg.global_norm(grads)
    size = sum(int(np.prod(v.shape)) for v in variables)
    metrics = {**metrics, 'grad_norm': norm, 'grad_rms': norm / np.sqrt(size)}
    if self._config.max_gradient_norm:
      grads, _ = tf.clip_by_global_norm(grads, self._config.max_gradient_norm, norm)
    self._optimizer.apply(grads, variables)
    self.num_steps.assign_add(1)
    return priorities, metrics

  def warm_up(self) -> bool:
    if self._item_signature is not None:
      b = self._config.batch_size
      self._train.get_concrete_function(batch_specs(self._item_signature, b),
                                        tf.TensorSpec((b,), tf.float32))
    return self._train.experimental_get_tracing_count() > 0

  def train_on(self, info, batch) -> Dict[str, float]:
    """`steps_per_call` SGD steps on a sampled batch (`steps_per_call * batch_size`
    sequences); writes the new priorities back to the table in one update.

    The target network is copied when the step count passes a multiple of
    `target_update_period` (with several steps per call, up to `steps_per_call - 1`
    steps after it).
    """
    weights = importance_weights(info.probability, info.table_size,
                                 self._config.importance_sampling_exponent)
    before = int(self.num_steps.numpy())
    steps = [self._train(part, w) for part, w in
             fused.slices(self.steps_per_call, batch, weights)]
    priorities = np.concatenate([p.numpy() for p, _ in steps])
    metrics = fused.mean_metrics([m for _, m in steps])
    local = getattr(self._batches, 'update_priorities', None)
    if local is not None:  # a reproducible run's in-process replay: set before the next sample
      self.priority_updates += local(info.key.numpy(), priorities)
    elif self._client is not None:
      self._write_priorities(info.key.numpy(), priorities)
    period = self._config.target_update_period
    if int(self.num_steps.numpy()) // period > before // period:
      self.update_target()
    out = dict(metrics)
    out['priority_updates'] = float(self.priority_updates)
    out['priority_updates_lost'] = float(self.priority_updates_lost)
    out['priority_update_timeouts'] = float(self.priority_update_timeouts)
    return out

  def _write_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
    """Sends new priorities to the table; while the replay server is away, counts them lost.

    An outage (the replay node crashed and is being restarted, or does not answer
    within `priority_timeout_s`) is logged once; the dataset notices it too. Any other
    error, raised while the server answers (a missing table, say), is a real one and
    raised.
    """
    if self._priority_call is not None:
      if self._priority_call.is_alive():  # still hung: start no second call
        self._lost(len(keys), 'an earlier update is still waiting for the server')
        return
      self._priority_call = None
    outcome: Dict[str, Any] = {}

    def update():
      try:
        self._client.mutate_priorities(
            self._table, updates=dict(zip(keys.tolist(), priorities.tolist())))
      except Exception as e:  # pylint: disable=broad-except
        outcome['error'] = e

    call = threading.Thread(target=update, name='priority-update', daemon=True)
    call.start()
    call.join(self._priority_timeout_s)
    if call.is_alive():
      self._priority_call = call
      self.priority_update_timeouts += 1
      self._lost(len(keys), f'no answer within {self._priority_timeout_s:.0f}s')
      return
    error = outcome.get('error')
    if error is not None:
      if not (is_server_away(error) or not server_answers(self._client)):
        raise error
      self._lost(len(keys), f'{type(error).__name__}: {str(error)[:200]}')
      return
    self.priority_updates += len(keys)
    self._priorities_failing = False

  def _lost(self, count: int, why: str) -> None:
    """Counts `count` priority updates lost to an outage; logs the outage's first."""
    self.priority_updates_lost += count
    if not self._priorities_failing:
      logging.warning('Priority updates failed (%s; the replay server is away); '
                      'counting the lost ones', why)
    self._priorities_failing = True

  def step(self) -> Dict[str, float] | None:
    sample = self._batches.next()
    if sample is None:
      return None
    info, batch = sample
    return self.train_on(info, batch)

  def close(self) -> None:
    if self._batches is not None:
      self._batches.close()
