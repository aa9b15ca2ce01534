"""The PPO learner step: one batch off the queue, `epochs` passes of shuffled minibatches.

Per learner step (SEED RL's policy-gradient agent, on our queue and loop):

1. take `batch_size` unrolls off the Reverb queue; scale rewards by the running std of
   discounted returns if asked (each env's return carried from its previous unroll,
   keyed by the `env_id` the policy stamps);
2. with the network as it is -- the proximal policy -- compute log-probabilities and
   values of the batch, and advantages and value targets (GAE, or V-trace's off-policy
   correction for stale unrolls; advantages again every epoch if asked);
3. `epochs` times, shuffle and split into `num_minibatches` minibatches -- of
   transitions for a feed-forward core, of whole unrolls for an LSTM (its state must
   run through the unroll); the shuffles are drawn from (seed, learner step) alone
   (`step_plan_rng`), so a resumed run has no generator state to restore -- and
   take one Adam step on each: the decoupled objective
   (the clip centred on the proximal policy, the behaviour policy corrected by a
   truncated importance weight) or plain PPO-clip (centred on the behaviour policy);
4. add the batch's observations to the running normalizer and set the network's
   `version` to the new learner step; the policy stamps it on every served step, so
   the policy lag (`policy_lag`, `policy_lag_max`) is measured;
5. with a KL target (`PPOConfig.kl_target`, off by default), move the next step's
   learning rate by this step's KL from the proximal policy (`adapted_learning_rate`);
   with a KL ceiling (`PPOConfig.kl_ceiling`, off), move the share of the scheduled
   rate the next step trains at (`ceiling_scale`).

Why the statistics change in step 4, not step 1: the normalizer is part of the policy.
Updated as the batch arrives, the learner's log-probs of fresh data differ from the
ones the policy acted with (the ratio is not 1 at zero lag), and the proximal policy
is one inference never served. Updated with the weights, they change with the version
the lag counts, and a batch of zero lag is evaluated exactly as it was acted on.

All minibatches of a learner step run in one compiled loop (one per epoch when
advantages are recomputed): at the MuJoCo defaults a step is 320 Adam steps, and two
calls and a host read per minibatch made the step 2.7x slower (`bench/learner_speed.py
--agent ppo`, HalfCheetah unrolls, alternated with the old code: 487 -> 1,308
transitions/s, medians of 3, load 10-14). A minibatch whose loss or gradients are not
finite is never applied (the variables stay good), the loop stops there and the step
raises `DivergedError`, which stops the run with the last good checkpoint kept.
Several learner devices still take one call per minibatch (`_replicated_fn`).
"""

from typing import Any, Dict, List, Tuple

import numpy as np
import sonnet as snt
import tensorflow as tf
import tree

from seedacme.agents.ppo import losses
from seedacme.agents.ppo.config import KL_CEILING_MIN_SCALE, PPOConfig
from seedacme.learner import replicas
from seedacme.learner.base import BatchLearner, DivergedError
from seedacme.normalization import RunningNormalizer
from seedacme.trajectories.datasets import ReverbBatches, batch_specs, time_major
from seedacme.types import FIRST, LAST

_BATCH_FIELDS = ('observation', 'first', 'raw_action', 'behaviour_log_prob',
                 'behaviour_value', 'proximal_log_prob', 'proximal_value', 'advantages',
                 'returns', 'mask')


def minibatch_plan(num_items: int, epochs: int, num_minibatches: int,
                   rng: np.random.Generator) -> List[np.ndarray]:
  """`epochs * num_minibatches` index arrays: each epoch a fresh permutation of
  `range(num_items)` split into equal parts, so every item is used exactly `epochs`
  times per learner step."""
  if num_items % num_minibatches:
    raise ValueError(f'{num_items} items do not split into {num_minibatches} minibatches')
  return [part.astype(np.int32) for _ in range(epochs)
          for part in np.split(rng.permutation(num_items), num_minibatches)]


def step_plan_rng(seed: int, step: int) -> np.random.Generator:
  """The generator of learner step `step`'s minibatch plan: a function of the agent's
  seed and the step only."""
  return np.random.default_rng([int(seed), int(step)])


def adapted_learning_rate(rate: float, kl: float, target: float, factor: float,
                          bounds: Tuple[float, float]) -> float:
  """The next learning rate for a KL target (rl_games's 'adaptive' rule): divided by
  `factor` when the step's KL passed twice the target, multiplied when it stayed under
  half of it, unchanged in between (or when the KL is not finite); within `bounds`."""
  return _moved_by_kl(rate, kl, 2.0 * target, 0.5 * target, factor, bounds)


def _moved_by_kl(value: float, kl: float, above: float, below: float, factor: float,
                 bounds: Tuple[float, float]) -> float:
  """`value` divided by `factor` when `kl` passed `above`, multiplied when it stayed
  under `below`, unchanged otherwise or when `kl` is not finite; within `bounds`."""
  if not np.isfinite(kl):
    return value
  if kl > above:
    value /= factor
  elif kl < below:
    value *= factor
  return float(min(max(value, bounds[0]), bounds[1]))


def ceiling_scale(scale: float, kl: float, ceiling: float, factor: float) -> float:
  """The next step's share of the scheduled rate under a KL ceiling: divided by
  `factor` when the step's KL passed the ceiling, multiplied (up to 1) when its KL
  times `factor` squared stayed under it, unchanged otherwise or when the KL is not
  finite; never below `KL_CEILING_MIN_SCALE`."""
  return _moved_by_kl(scale, kl, ceiling, ceiling / factor ** 2, factor,
                      (KL_CEILING_MIN_SCALE, 1.0))


def _flat2(x: tf.Tensor) -> tf.Tensor:
  """`[T, B, ...]` -> `[T * B, ...]`."""
  return tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))


class PPOLearner(BatchLearner):
  """PPO (decoupled or clip) on unrolls from the queue; shares `network` with inference."""

  def __init__(self, network: snt.Module, config: PPOConfig,
               batches: ReverbBatches | None,
               item_signature: Dict[str, tf.TensorSpec] | None = None):
    self._network = network
    self._config = config
    self._batches = batches
    self._item_signature = item_signature
    self._recurrent = config.core == 'lstm'
    self._learning_rate = tf.Variable(config.learning_rate, trainable=False,
                                      dtype=tf.float32)
    self._optimizer = snt.optimizers.Adam(self._learning_rate, epsilon=config.adam_epsilon)
    self._kl_scale = tf.Variable(1.0, trainable=False, dtype=tf.float32)  # kl_ceiling's
    self.num_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    self._reward_stats = RunningNormalizer((), clip=None) if config.normalize_rewards \
        else None
    self._env_returns: Dict[int, float] = {}  # per env, the return its last unroll ended at
    self._prepare_fn = tf.function(self._prepare, experimental_relax_shapes=True)
    self._returns_fn = tf.function(
        lambda r, f, m, g: losses.running_returns(r, f, m, config.discount, g),
        experimental_relax_shapes=True)
    self._scale_rewards_fn = tf.function(self._scale_rewards,
                                         experimental_relax_shapes=True)
    self._update_normalizer_fn = tf.function(
        lambda observations: self._network.update_normalizer(observations),
        experimental_relax_shapes=True)
    self._advantages_fn = tf.function(self._advantages, experimental_relax_shapes=True)
    self._grads_fn = tf.function(self._grads, experimental_relax_shapes=True)
    self._minibatches_fn = tf.function(self._minibatches, experimental_relax_shapes=True)
    self._metric_keys: List[str] | None = None  # what `_grads` reports, in order
    # Several learner devices: each takes its share of a minibatch's indices, and the
    # (all-reduced) update is applied in the same call, only if it is finite.
    self._devices = replicas.current()
    self._devices.build_optimizer(self._optimizer, network)
    self._replicated_fn = tf.function(
        lambda data, indices: self._devices.run(self._replica_update, indices,
                                                shared=(data,)),
        experimental_relax_shapes=True)
    self.last_unroll_uses: np.ndarray | None = None  # per unroll, epochs it trained on

  @property
  def optimizer(self) -> snt.Optimizer:
    return self._optimizer

  def checkpoint_state(self) -> Dict[str, Any]:
    state = {'network': self._network, 'optimizer': self._optimizer,
             'num_steps': self.num_steps}
    if self._reward_stats is not None:
      state['reward_stats'] = self._reward_stats
    if self._config.kl_target is not None:  # the adapted rate is state, a schedule is not
      state['learning_rate'] = self._learning_rate
    if self._config.kl_ceiling is not None:
      state['kl_scale'] = self._kl_scale
    return state

  def resume_state(self) -> Dict[str, Any]:
    """Each env's return carried into its next unroll (`carry_reward_returns`)."""
    return {'env_returns': dict(self._env_returns)}

  def load_resume_state(self, state: Dict[str, Any]) -> None:
    self._env_returns = dict(state.get('env_returns', {}))

  # ---- in-graph parts --------------------------------------------------------------
  def _scale_rewards(self, rewards, returns, mask):
    """Adds the returns to the statistics; rewards divided by their std, clipped."""
    self._reward_stats.update(tf.reshape(returns, [-1]), tf.reshape(mask > 0, [-1]))
    std = tf.cast(tf.sqrt(self._reward_stats.var + 1e-8), tf.float32)
    clip = self._config.reward_norm_clip
    return tf.clip_by_value(rewards / std, -clip, clip)

  def _prepare(self, batch):
    """The batch time-major, rewards and discounts as the losses want them (transition
    t: x_t -> x_{t+1}; masked where x_t is LAST); rewards not yet normalized."""
    c = self._config
    observation = time_major(batch['observation'])
    step_type = time_major(batch['step_type'])
    first = tf.equal(step_type, FIRST)
    mask = tf.cast(tf.not_equal(step_type[:-1], LAST), tf.float32)
    rewards = tf.cast(time_major(batch['reward']), tf.float32)[1:]
    if c.reward_clip is not None:
      rewards = tf.clip_by_value(rewards, -c.reward_clip, c.reward_clip)
    rewards = rewards * c.reward_scale
    extras = {k: time_major(batch[k]) for k in ('raw_action', 'log_prob', 'value',
                                                'policy_version', 'env_id')}
    return {'observation': observation, 'first': first, 'mask': mask,
            'rewards': rewards,
            'discounts': c.discount * tf.cast(time_major(batch['discount']), tf.float32)[1:],
            'raw_action': extras['raw_action'], 'behaviour_log_prob': extras['log_prob'],
            'behaviour_value': extras['value'], 'policy_version': extras['policy_version'],
            'env_id': extras['env_id'][0], 'initial_state': batch.get('initial_state', ())}

  def _normalized_rewards(self, prepared):
    """Rewards divided by the running std of each env's discounted return, which runs
    on from the env's previous unroll (two unrolls of one env in a batch: in order)."""
    rewards = prepared['rewards']
    first, mask = prepared['first'][:-1].numpy(), prepared['mask'].numpy()
    env_ids = prepared['env_id'].numpy()
    carry = self._config.carry_reward_returns
    occurrence = np.zeros(len(env_ids), np.int64)
    seen: Dict[int, int] = {}
    for b, e in enumerate(env_ids.tolist()):
      occurrence[b] = seen.get(e, 0)
      seen[e] = occurrence[b] + 1
    returns = np.zeros(rewards.shape, np.float32)
    for k in range(int(occurrence.max()) + 1):
      cols = np.flatnonzero(occurrence == k)
      initial = np.array([self._env_returns.get(int(e), 0.0) if carry else 0.0
                          for e in env_ids[cols]], np.float32)
      out, final = self._returns_fn(tf.gather(rewards, cols, axis=1), first[:, cols],
                                    mask[:, cols], initial)
      returns[:, cols] = out.numpy()
      self._env_returns.update(zip(env_ids[cols].tolist(), final.numpy().tolist()))
    return self._scale_rewards_fn(rewards, tf.constant(returns), prepared['mask'])

  def _advantages(self, data):
    """`(advantages, returns, log_probs, values)`, each `[T, B]`, with the network's
    current weights: the last two are the proximal policy's at the batch's arrival."""
    c = self._config
    params, values = self._network.unroll(data['observation'], data['first'],
                                          data['initial_state'])
    log_probs = self._network.head.log_prob(tree.map_structure(lambda p: p[:-1], params),
                                            data['raw_action'][:-1])
    if c.advantage_estimator == 'gae':
      out = losses.gae(data['rewards'], data['discounts'], values[:-1], values[-1],
                       data['mask'], c.gae_lambda)
    else:
      out = losses.vtrace_advantages(log_probs, data['behaviour_log_prob'][:-1],
                                     data['rewards'], data['discounts'], values[:-1],
                                     values[-1], data['mask'], c.gae_lambda)
    return out.advantages, out.returns, log_probs, values[:-1]

  def _minibatch(self, data, indices):
    """The minibatch `indices` selects: transitions of `[T*B]` for a feed-forward core
    (as `[1, n]`), whole unrolls (`[T, n]`, with their initial states) for an LSTM."""
    if self._recurrent:
      mb = {k: tf.gather(data[k], indices, axis=1) for k in _BATCH_FIELDS}
      mb['initial_state'] = tree.map_structure(lambda s: tf.gather(s, indices),
                                               data['initial_state'])
      return mb
    mb = {k: tf.gather(_flat2(data[k]), indices)[None] for k in _BATCH_FIELDS}
    mb['initial_state'] = ()
    return mb

  def _grads(self, data, indices):
    c = self._config
    mb = self._minibatch(data, indices)
    head = self._network.head
    variables = self._network.trainable_variables
    with tf.GradientTape() as tape:
      params, values = self._network.unroll(mb['observation'], mb['first'],
                                            mb['initial_state'])
      log_probs = head.log_prob(params, mb['raw_action'])  # heads take [T, b, ...]
      entropy = head.entropy(params)
      advantages = mb['advantages']
      if c.normalize_advantages:
        advantages = losses.normalize_advantages(advantages, mb['mask'])
      kwargs = dict(clip_epsilon=c.clip_epsilon, value_clip=c.value_clip,
                    baseline_cost=c.baseline_cost, entropy_cost=c.entropy_cost)
      if c.objective == 'decoupled':  # V-trace's advantages carry the correction
        loss, metrics = losses.decoupled_ppo_loss(
            log_probs, mb['proximal_log_prob'], mb['behaviour_log_prob'], advantages,
            values, mb['proximal_value'], mb['returns'], entropy, mb['mask'],
            behaviour_weight_clip=c.behaviour_weight_clip,
            correct_behaviour=c.advantage_estimator != 'vtrace', **kwargs)
        # Its ratio is to the proximal policy: its own metrics are the drift.
        drift = {'proximal_clip_fraction': metrics['clip_fraction'],
                 'proximal_approx_kl': metrics['approx_kl']}
      else:
        loss, metrics = losses.ppo_loss(
            log_probs, mb['behaviour_log_prob'], advantages, values,
            mb['behaviour_value'], mb['returns'], entropy, mb['mask'], **kwargs)
        metrics.update(losses.behaviour_weights(
            mb['proximal_log_prob'], mb['behaviour_log_prob'], mb['mask'],
            c.behaviour_weight_clip)[1])
        drift = losses.proximal_drift(log_probs, mb['proximal_log_prob'], mb['mask'],
                                      c.clip_epsilon)
      metrics.update(drift)
    grads = replicas.all_reduce_mean(tape.gradient(loss, variables))
    if c.max_gradient_norm:
      grads, norm = tf.clip_by_global_norm(grads, c.max_gradient_norm)
    else:
      norm = tf.linalg.global_norm(grads)
    metrics['grad_norm'] = norm
    return grads, metrics

  def _apply(self, grads):
    self._optimizer.apply(grads, self._network.trainable_variables)

  def _minibatches(self, data, plan):
    """One Adam step per row of `plan` (`[n, m]` indices), in one compiled call: the
    sums of each step's metrics (in `_metric_keys` order), and where a step's loss or
    gradients were not finite, its index and metrics (-1 if none). That step and the
    ones after it are not applied."""
    keys = self._metric_keys
    sums = tf.zeros([len(keys)])
    bad = tf.zeros([len(keys)])
    failed = tf.constant(-1)
    for i in tf.range(tf.shape(plan)[0]):
      grads, metrics = self._grads(data, plan[i])
      values = tf.stack([tf.cast(metrics[k], tf.float32) for k in keys])
      finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(x))
                              for x in [values] + list(grads)])
      if finite:
        self._apply(grads)
        sums += values
      else:
        failed = i
        bad = values
        break
    return sums, failed, bad

  def _replica_update(self, data, indices):
    """One replica's share of a minibatch: gradients all-reduced, then applied where
    the loss and every gradient are finite (the same on every replica)."""
    grads, metrics = self._grads(data, indices)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(x))
                            for x in [metrics['loss']] + list(grads)])

    def apply():
      self._apply(grads)
      return tf.constant(True)
    tf.cond(finite, apply, lambda: tf.constant(False))
    return {k: replicas.all_reduce_mean(v) for k, v in metrics.items()}

  # ---- the step --------------------------------------------------------------------
  def _training_data(self, prepared, proximal, advantages, returns):
    """What minibatches select from: the T transitions of every unroll."""
    data = {'observation': prepared['observation'][:-1], 'first': prepared['first'][:-1],
            'raw_action': prepared['raw_action'][:-1],
            'behaviour_log_prob': prepared['behaviour_log_prob'][:-1],
            'behaviour_value': prepared['behaviour_value'][:-1],
            'proximal_log_prob': proximal[0], 'proximal_value': proximal[1],
            'advantages': advantages, 'returns': returns, 'mask': prepared['mask'],
            'initial_state': prepared['initial_state']}
    return data

  def prepare(self, batch) -> Dict[str, Any]:
    """The batch as the losses take it, rewards normalized (this updates the reward
    statistics and each env's running return, as `train_on` does)."""
    prepared = dict(self._prepare_fn(batch))
    if self._reward_stats is not None:
      prepared['rewards'] = self._normalized_rewards(prepared)
    return prepared

  def advantages(self, batch):
    """Advantages and value targets (numpy `[T, B]`) of a batch of unrolls with the
    network as it is (what the next `train_on` starts from; reward statistics are
    updated as `train_on` would)."""
    advantages, returns, _, _ = self._advantages_fn(self.prepare(batch))
    return advantages.numpy(), returns.numpy()

  def warm_up(self) -> bool:
    if self._item_signature is None:
      return False
    specs = batch_specs(self._item_signature, self._config.batch_size)
    self._prepare_fn.get_concrete_function(specs)
    return True

  def _run_minibatches(self, data, plan: np.ndarray, first: int) -> Dict[str, float]:
    """The Adam steps of `plan` (`[n, m]`; `first`: the index of its first row in the
    learner step): metric sums; `DivergedError` at a step that is not finite."""
    if self._devices.num_replicas > 1:  # per minibatch, applied in the call if finite
      sums: Dict[str, float] = {}
      for i, indices in enumerate(plan):
        metrics = {k: float(np.asarray(v)) for k, v in
                   self._replicated_fn(data, tf.constant(indices)).items()}
        if not all(np.isfinite(v) for v in metrics.values()):
          self._diverged(first + i, metrics)
        for k, v in metrics.items():
          sums[k] = sums.get(k, 0.0) + v
      return sums
    if self._metric_keys is None:
      traced = self._grads_fn.get_concrete_function(data, tf.constant(plan[0]))
      self._metric_keys = sorted(traced.structured_outputs[1])
      # Adam's slots now, eagerly: the loop applies inside a conditional, where
      # variables cannot be created (Sonnet's `_initialize` runs once).
      self._optimizer._initialize(  # pylint: disable=protected-access
          list(self._network.trainable_variables))
    sums, failed, bad = self._minibatches_fn(data, tf.constant(plan))
    if int(failed) >= 0:
      self._diverged(first + int(failed), dict(zip(self._metric_keys, bad.numpy())))
    return dict(zip(self._metric_keys, sums.numpy().tolist()))

  def _diverged(self, minibatch: int, metrics: Dict[str, float]):
    raise DivergedError(f'non-finite PPO loss at learner step '
                        f'{int(self.num_steps.numpy()) + 1}, minibatch {minibatch}: '
                        + ', '.join(f'{k}={v:.4g}' for k, v in sorted(metrics.items())))

  def train_on(self, batch) -> Dict[str, float]:
    """One learner step on a given batch (used by `step` and by tests)."""
    c = self._config
    if c.learning_rate_decay_steps or c.kl_ceiling is not None:
      done = (min(1.0, float(self.num_steps.numpy()) / c.learning_rate_decay_steps)
              if c.learning_rate_decay_steps else 0.0)
      self._learning_rate.assign(
          c.learning_rate * (1.0 - done) * float(self._kl_scale.numpy()))
    if c.normalizer_update == 'on_arrival' and self._network.normalizer is not None:
      self._update_normalizer_fn(time_major(batch['observation'])[:-1])
    prepared = self.prepare(batch)
    num_unrolls = int(prepared['mask'].shape[1])
    unroll_length = int(prepared['mask'].shape[0])
    items = num_unrolls if self._recurrent else num_unrolls * unroll_length
    plan = np.stack(minibatch_plan(items, c.epochs, c.num_minibatches,
                                   step_plan_rng(c.seed, int(self.num_steps.numpy()))))
    # Before any step: the proximal policy's log-probs and values, and advantages.
    advantages, returns, *proximal = self._advantages_fn(prepared)
    data = self._training_data(prepared, proximal, advantages, returns)
    # All steps in one call, or one call per epoch when advantages are recomputed.
    per_call = c.num_minibatches if c.recompute_advantages else len(plan)
    sums: Dict[str, float] = {}
    for start in range(0, len(plan), per_call):
      if start:
        data = self._training_data(prepared, proximal, *self._advantages_fn(prepared)[:2])
      for k, v in self._run_minibatches(data, plan[start:start + per_call], start).items():
        sums[k] = sums.get(k, 0.0) + v
    unroll_of = plan if self._recurrent else plan % num_unrolls
    self.last_unroll_uses = np.bincount(unroll_of.ravel(), minlength=num_unrolls) * (
        1.0 if self._recurrent else 1.0 / unroll_length)
    # The statistics change with the weights (module docstring).
    if c.normalizer_update == 'after_epochs' and self._network.normalizer is not None:
      self._update_normalizer_fn(prepared['observation'][:-1])
    self.num_steps.assign_add(1)
    self._network.version.assign(tf.cast(self.num_steps, tf.int32))
    out = {k: v / len(plan) for k, v in sums.items()}
    versions = prepared['policy_version'].numpy()
    lag = int(self.num_steps.numpy()) - 1 - versions
    env_ids = prepared['env_id'].numpy()
    # distinct_envs: the share of the batch's unrolls from different envs (1: one
    # unroll per env; lower: some envs ran ahead and gave two).
    out.update(policy_lag=float(lag.mean()), policy_lag_max=float(lag.max()),
               distinct_envs=len(set(env_ids.tolist())) / len(env_ids),
               learning_rate=float(self._learning_rate.numpy()))
    if c.kl_target is not None:  # the next step's rate, from this step's KL
      self._learning_rate.assign(adapted_learning_rate(
          out['learning_rate'], out['proximal_approx_kl'], c.kl_target,
          c.kl_rate_factor, c.kl_rate_bounds))
    if c.kl_ceiling is not None:  # the next step's share of the schedule
      out['kl_scale'] = float(self._kl_scale.numpy())
      self._kl_scale.assign(ceiling_scale(out['kl_scale'], out['proximal_approx_kl'],
                                          c.kl_ceiling, c.kl_ceiling_factor))
    return out
