"""The V-trace learner step: unrolls from the Reverb queue -> V-trace loss -> Adam or RMSprop."""

from typing import Any, Dict

import numpy as np
import sonnet as snt
import tensorflow as tf
import tree

from seedacme.agents.vtrace import losses, optimizers
from seedacme.agents.vtrace.config import VTraceConfig
from seedacme.types import FIRST, LAST
from seedacme.learner import replicas
from seedacme.learner.base import BatchLearner
from seedacme.trajectories.datasets import ReverbBatches, batch_specs, time_major




def unroll_loss(network: snt.Module, batch: Dict[str, tf.Tensor],
                config: VTraceConfig):
  """Loss of a batch of unrolls (batch-major `[B, T+1, ...]`, as stored in Reverb).

  Step t of an unroll holds x_t, the reward and discount that arrived with x_t, its
  step type, the action taken at x_t and the behaviour logits. Transition t is
  (x_t, a_t) -> x_{t+1}: its reward and discount are those stored at t + 1, and it does
  not exist when x_t is an episode's LAST step (the next step starts a new episode).
  """
  observation = time_major(batch['observation'])
  step_type = time_major(batch['step_type'])
  reward = tf.cast(time_major(batch['reward']), tf.float32)
  discount = tf.cast(time_major(batch['discount']), tf.float32)
  action = time_major(batch['action'])
  initial_state = batch.get('initial_state', ())

  logits, values = network.unroll(observation, tf.equal(step_type, FIRST), initial_state)

  rewards = reward[1:]
  if config.reward_clip is not None:
    rewards = tf.clip_by_value(rewards, -config.reward_clip, config.reward_clip)
  rewards = rewards * config.reward_scale
  mask = tf.cast(tf.not_equal(step_type[:-1], LAST), tf.float32)
  head = getattr(network, 'action_head', None)
  if head is not None:  # continuous actions: the head's log-probabilities
    params = tree.map_structure(lambda p: p[:-1], logits)  # heads take [T, B, ...]
    return losses.vtrace_loss_from_log_probs(
        head.log_prob(params, time_major(batch['raw_action'])[:-1]),
        time_major(batch['log_prob'])[:-1], head.entropy(params),
        rewards, config.discount * discount[1:], values[:-1], values[-1], mask,
        baseline_cost=config.baseline_cost, entropy_cost=config.entropy_cost,
        clip_rho_threshold=config.clip_rho_threshold,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold,
        clip_c_threshold=config.clip_c_threshold)
  return losses.vtrace_loss(
      target_logits=logits[:-1], behaviour_logits=time_major(batch['logits'])[:-1],
      actions=action[:-1], rewards=rewards, discounts=config.discount * discount[1:],
      values=values[:-1], bootstrap_value=values[-1], mask=mask,
      baseline_cost=config.baseline_cost, entropy_cost=config.entropy_cost,
      clip_rho_threshold=config.clip_rho_threshold,
      clip_pg_rho_threshold=config.clip_pg_rho_threshold,
      clip_c_threshold=config.clip_c_threshold)


class VTraceLearner(BatchLearner):
  """SGD on V-trace unrolls; shares `network` with the inference server."""

  def __init__(self, network: snt.Module, config: VTraceConfig,
               batches: ReverbBatches | None,
               item_signature: Dict[str, tf.TensorSpec] | None = None):
    """`item_signature` (one unroll's specs) lets `warm_up` trace the step early."""
    self._network = network
    self._item_signature = item_signature
    self._config = config
    self._batches = batches
    self._optimizer = optimizers.make_optimizer(config)
    self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._devices = replicas.current()  # one device, or data-parallel over several
    self._devices.build_optimizer(self._optimizer, network)
    self._train = tf.function(self._train_step, experimental_relax_shapes=True,
                              jit_compile=config.jit_compile)

  @property
  def optimizer(self) -> snt.Optimizer:
    return self._optimizer

  def checkpoint_state(self) -> Dict[str, Any]:
    return {'network': self._network, 'optimizer': self._optimizer,
            'num_steps': self.num_steps}

  def _train_step(self, batch):
    normalizer = getattr(self._network, 'normalizer', None)
    if normalizer is not None:  # inference reads the same statistics
      observation = time_major(batch['observation'])[:-1]
      normalizer.update(tf.cast(observation, tf.float32))  # [T, B, ...] as it comes
    return self._devices.run(self._replica_step, batch)

  def _replica_step(self, batch):
    """One replica's part of the step (the whole step on one device)."""
    with tf.GradientTape() as tape:
      loss, metrics = unroll_loss(self._network, batch, self._config)
    variables = self._network.trainable_variables
    grads = replicas.all_reduce_mean(tape.gradient(loss, variables))
    if self._config.max_gradient_norm:
      grads, norm = tf.clip_by_global_norm(grads, self._config.max_gradient_norm)
    else:
      norm = tf.linalg.global_norm(grads)
    self._optimizer.apply(grads, variables)
    self.num_steps.assign_add(1)
    metrics['grad_norm'] = norm
    return metrics

  def warm_up(self) -> bool:
    if self._item_signature is not None:
      self._train.get_concrete_function(
          batch_specs(self._item_signature, self._config.batch_size))
    return self._train.experimental_get_tracing_count() > 0

  def train_on(self, batch) -> Dict[str, float]:
    """One SGD step on a given batch (used by `step` and by tests)."""
    return {k: float(np.asarray(v)) for k, v in self._train(batch).items()}
