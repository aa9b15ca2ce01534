"""The SAC learner step: a uniform batch of (n+1)-step items -> critics, actor, temperature.

Per step, on `batch_size` items sampled uniformly from the replay table:

1. n-step targets per item, cut at the first LAST step: a termination (discount 0)
   ends the return, a time-limit truncation (discount 1) bootstraps from the LAST
   observation; an item that starts on a LAST step holds no transition and is dropped;
2. the twin critics regress on r + discount * (min of the target critics at the next
   observation and a fresh action - alpha * its log-probability);
3. the actor maximizes min(Q1, Q2) - alpha * log pi with a reparameterized sample;
4. the temperature moves alpha toward the target entropy (-|A| by default);
5. the target critics follow by Polyak averaging (tau).

Log-probabilities are in [-1, 1] action units (the head's minus its constant
`affine_log_det`), the units of SAC's target entropy -|A|.
"""

from typing import Any, Dict

import sonnet as snt
import tensorflow as tf

from seedacme.agents.sac import losses
from seedacme.agents.sac.config import SACConfig
from seedacme.agents.sac.networks import SACNetworks
from seedacme.learner import fused
from seedacme.learner.base import BatchLearner
from seedacme.trajectories.datasets import ReverbBatches, batch_specs
from seedacme.trajectories.packing import PACKED, PackedLayout
from seedacme.types import LAST


def n_step_transitions(batch: Dict[str, tf.Tensor], n: int, gamma: float):
  """From items of n + 1 steps `[B, n+1, ...]`: (valid [B], reward sums [B], bootstrap
  discounts [B], index of the bootstrap observation [B]).

  Transition j (x_j -> x_{j+1}) counts while no step before it, x_0 included, was LAST;
  its reward and discount are those stored at j + 1.
  """
  last = tf.cast(tf.equal(batch['step_type'], LAST), tf.float32)[:, :n]
  alive = tf.math.cumprod(1.0 - last, axis=1)  # [B, n]: transition j exists
  discount = tf.cast(batch['discount'], tf.float32)[:, 1:]
  reward = tf.cast(batch['reward'], tf.float32)[:, 1:]
  # gamma^j * prod_{i<j} d_{i+1}: the weight of reward j.
  weights = tf.math.cumprod(gamma * discount, axis=1, exclusive=True)
  reward_sum = tf.reduce_sum(alive * weights * reward, axis=1)
  steps = tf.cast(tf.reduce_sum(alive, axis=1), tf.int32)  # bootstrap from x_steps
  bootstrap = tf.gather(tf.concat([tf.ones_like(weights[:, :1]),
                                   tf.math.cumprod(gamma * discount, axis=1)], 1),
                        steps, batch_dims=1)
  return alive[:, 0] > 0, reward_sum, bootstrap, steps


class SACLearner(BatchLearner):
  """SAC on uniform replay; the actor is the policy the server runs."""

  def __init__(self, networks: SACNetworks, config: SACConfig,
               batches: ReverbBatches | None,
               item_signature: Dict[str, tf.TensorSpec] | None = None,
               layout: PackedLayout | None = None):
    """`layout`: how sampled items are packed (`SACBuilder.layout`); batches of packed
    items are unpacked inside the compiled step, batches of fields are taken as they
    are."""
    if item_signature is not None and PACKED in item_signature and layout is None:
      raise ValueError('SACLearner: the items are packed (item_signature has '
                       f'{PACKED!r}) but no layout says how to unpack them')
    self._nets = networks
    self._layout = layout
    self._config = config
    self._batches = batches
    self._item_signature = item_signature
    self._actor_optimizer = snt.optimizers.Adam(config.actor_learning_rate)
    self._critic_optimizer = snt.optimizers.Adam(config.critic_learning_rate)
    self._alpha_optimizer = snt.optimizers.Adam(config.alpha_learning_rate)
    head = networks.actor.head
    self._target_entropy = (float(config.target_entropy) if config.target_entropy
                            is not None else -float(head.size))
    self._rng = tf.random.Generator.from_seed(config.seed + 1)
    self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.steps_per_call = config.sgd_steps_per_sample
    self._train = tf.function(self._unpacked_step, experimental_relax_shapes=True)

  def checkpoint_state(self) -> Dict[str, Any]:
    return {'networks': self._nets, 'actor_optimizer': self._actor_optimizer,
            'critic_optimizer': self._critic_optimizer,
            'alpha_optimizer': self._alpha_optimizer, 'num_steps': self.num_steps}

  def resume_state(self) -> Dict[str, Any]:
    """The action-sampling generator's state (not a checkpointed variable): a round
    checkpoint's resume draws the uninterrupted run's actions."""
    return {'rng_state': self._rng.state.numpy()}

  def load_resume_state(self, state: Dict[str, Any]) -> None:
    if 'rng_state' in state:
      self._rng.state.assign(state['rng_state'])

  def _sample(self, observation):
    """A reparameterized action in [-1, 1] units and its log-probability there."""
    (params, _), _ = self._nets.actor(observation)
    head = self._nets.actor.head
    raw = head.sample(params, self._rng)
    return tf.tanh(raw), losses.unit_log_prob(head.log_prob(params, raw), head.affine_log_det)

  def _clip(self, grads):
    if self._config.max_gradient_norm:
      grads, _ = tf.clip_by_global_norm(grads, self._config.max_gradient_norm)
    return grads

  def _train_step(self, batch):
    c, nets = self._config, self._nets
    valid, reward_sum, bootstrap, steps = n_step_transitions(batch, c.n_step, c.discount)
    observation = tf.boolean_mask(batch['observation'][:, 0], valid)
    next_observation = tf.boolean_mask(
        tf.gather(batch['observation'], steps, batch_dims=1), valid)
    unit_action = tf.tanh(tf.boolean_mask(batch['raw_action'][:, 0], valid))
    reward_sum = tf.boolean_mask(reward_sum, valid) * c.reward_scale
    bootstrap = tf.boolean_mask(bootstrap, valid)
    if nets.actor.normalizer is not None:
      nets.actor.normalizer.update(tf.cast(observation, tf.float32))
    inputs = nets.actor.inputs(observation)
    next_inputs = nets.actor.inputs(next_observation)
    alpha = tf.exp(nets.log_alpha)

    next_action, next_log_prob = self._sample(next_observation)
    next_q = [t(next_inputs, next_action) for t in nets.targets]
    critic_variables = nets.critic_variables()
    with tf.GradientTape() as tape:
      q1, q2 = (critic(inputs, unit_action) for critic in nets.critics)
      critic_loss, metrics = losses.critic_loss(q1, q2, reward_sum, bootstrap, next_q[0],
                                                next_q[1], next_log_prob, alpha)
    self._critic_optimizer.apply(
        self._clip(tape.gradient(critic_loss, critic_variables)), critic_variables)

    actor_variables = nets.actor.trainable_variables
    with tf.GradientTape() as tape:
      action, log_prob = self._sample(observation)
      q1_pi, q2_pi = (critic(inputs, action) for critic in nets.critics)
      actor_loss, actor_metrics = losses.actor_loss(q1_pi, q2_pi, log_prob, alpha)
    self._actor_optimizer.apply(
        self._clip(tape.gradient(actor_loss, actor_variables)), actor_variables)

    with tf.GradientTape() as tape:
      alpha_loss, alpha_metrics = losses.temperature_loss(nets.log_alpha, log_prob,
                                                          self._target_entropy)
    self._alpha_optimizer.apply(tape.gradient(alpha_loss, [nets.log_alpha]),
                                [nets.log_alpha])
    for target, critic in zip(nets.targets, nets.critics):
      losses.polyak_update(target.variables, critic.variables, c.tau)
    self.num_steps.assign_add(1)
    metrics.update(actor_metrics)
    metrics.update(alpha_metrics)
    metrics['valid_fraction'] = tf.reduce_mean(tf.cast(valid, tf.float32))
    return metrics

  def _unpacked_step(self, batch):
    if PACKED in batch:
      batch = self._layout.unpack(batch[PACKED])
    return self._train_step(batch)

  def warm_up(self) -> bool:
    if self._item_signature is None:
      return False
    self._train.get_concrete_function(
        batch_specs(self._item_signature, self._config.batch_size))
    return True

  def train_on(self, batch) -> Dict[str, float]:
    """`steps_per_call` SAC steps, each on its own consecutive slice of a batch of
    `steps_per_call * batch_size` items (used by `step` and by tests); the metrics are
    their means."""
    return fused.mean_metrics([self._train(part) for (part,) in
                               fused.slices(self.steps_per_call, batch)])
