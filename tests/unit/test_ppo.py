"""PPO's learner and policy on the SEED core (the losses: tests/unit/test_ppo_losses.py;
stale data and the normalizers' statistics: test_ppo_async.py).

Each transition is gathered by the gradient steps exactly once per epoch (read back
from inside the compiled step: transitions shuffled for a feed-forward core, whole
unrolls with their state for an LSTM); the policy serves the network on inputs
normalized with the learner's current statistics, which reach an actor-side copy and
come back from a checkpoint; a time-limit truncation bootstraps through the learner; a
NaN loss raises `DivergedError` before anything is applied; a policy whose actions
leave the bounds stops the run as 'diverged'; and returns rise on CartPole.
"""

import json
import os
import threading

import numpy as np
import pytest
import tensorflow as tf


from seedacme.agents.ppo import PPOBuilder, PPOConfig
from seedacme.agents.ppo.learning import (PPOLearner, adapted_learning_rate, ceiling_scale,
                                         minibatch_plan)
from seedacme.learner.base import DivergedError
from seedacme.learner.checkpointing import Checkpointer
from seedacme.types import FIRST, LAST, MID, EnvSpec

DISCRETE = EnvSpec((4,), 'float32', 3)
CONTINUOUS = EnvSpec((5,), 'float32', 0, (2,), (-1.0, -2.0), (1.0, 0.5))


def _batch(builder, spec, seed=0, step_type=None, reward=None, discount=None,
           observation_scale=(0.0, 1.0)):
  """A batch of `batch_size` unrolls shaped as the queue's items (observations with
  `observation_scale`'s mean and std)."""
  rng = np.random.default_rng(seed)
  signature = builder.item_signature(spec)
  b = builder.config.batch_size

  def fill(name, s):
    shape = (b,) + tuple(s.shape)
    if name == 'step_type':
      x = np.full(shape, MID, np.int8) if step_type is None else step_type
      if step_type is None:
        x[:, 0] = FIRST
      return tf.constant(x)
    if name == 'reward' and reward is not None:
      return tf.constant(reward, tf.float32)
    if name == 'discount':
      return tf.constant(np.ones(shape, np.float32) if discount is None else discount)
    if s.dtype.is_integer:
      return tf.zeros(shape, s.dtype)
    if name == 'observation':
      return tf.constant(rng.normal(*observation_scale, size=shape).astype(np.float32))
    return tf.constant(rng.normal(size=shape).astype(s.dtype.as_numpy_dtype))
  return {k: (tf.nest.map_structure(lambda s: fill('state', s), v) if k == 'initial_state'
              else fill(k, v)) for k, v in signature.items()}


def _learner(config, spec=DISCRETE):
  builder = PPOBuilder(config)
  network = builder.make_networks(spec)
  return builder, network, PPOLearner(network, config, None, builder.item_signature(spec))


def test_minibatch_plan_uses_every_item_exactly_epochs_times():
  plan = minibatch_plan(48, epochs=3, num_minibatches=4, rng=np.random.default_rng(0))
  assert len(plan) == 12 and all(len(p) == 12 for p in plan)
  for epoch in range(3):  # each epoch is a permutation
    assert sorted(np.concatenate(plan[4 * epoch:4 * epoch + 4])) == list(range(48))
  with pytest.raises(ValueError, match='do not split'):
    minibatch_plan(10, 1, 4, np.random.default_rng(0))


class _SpyLearner(PPOLearner):
  """Records what each gradient step gathered (inside the compiled step)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.gathered = []

  def _minibatch(self, data, indices):
    mb = super()._minibatch(data, indices)
    state = tf.nest.flatten(mb['initial_state'])
    def record(observation, log_prob, *state):
      self.gathered.append((observation.numpy()[..., 0], log_prob.numpy(),
                            state[0].numpy()[:, 0] if state else None))
      return 0
    tf.py_function(record, [mb['observation'], mb['behaviour_log_prob']] + state[:1],
                   tf.int32)
    return mb


@pytest.mark.parametrize('core', ['feedforward', 'lstm'])
def test_each_transition_is_gathered_exactly_once_per_epoch(core):
  """Transitions carry their (unroll, step) in the observation and the behaviour
  log-prob, unrolls their index in the initial state: what the gradient steps
  gathered is read back, not the plan."""
  T, B, epochs, parts = 6, 8, 3, 4
  config = PPOConfig(core=core, unroll_length=T, batch_size=B, epochs=epochs,
                     num_minibatches=parts, hidden_sizes=(16,), lstm_size=8)
  builder = PPOBuilder(config)
  network = builder.make_networks(DISCRETE)
  learner = _SpyLearner(network, config, None, builder.item_signature(DISCRETE))
  batch = _batch(builder, DISCRETE)
  ids = 100.0 * np.arange(B)[:, None] + np.arange(T + 1)[None]  # [B, T + 1]
  observation = batch['observation'].numpy()
  observation[..., 0] = ids
  batch['observation'] = tf.constant(observation)
  batch['log_prob'] = tf.constant(ids, tf.float32)
  if core == 'lstm':
    batch['initial_state'] = tf.nest.map_structure(
        lambda s: tf.constant(np.broadcast_to(np.arange(B, dtype=np.float32)[:, None],
                                              s.shape.as_list())), batch['initial_state'])
  metrics = learner.train_on(batch)
  assert np.isfinite(metrics['loss'])
  assert len(learner.gathered) == epochs * parts
  seen = []
  for observation_ids, log_prob_ids, state_rows in learner.gathered:
    np.testing.assert_array_equal(observation_ids, log_prob_ids)  # fields stay aligned
    if core == 'lstm':  # whole unrolls, in time order, with their own initial state
      assert observation_ids.shape == (T, B // parts)
      unrolls = observation_ids[0] // 100
      np.testing.assert_array_equal(observation_ids, 100 * unrolls + np.arange(T)[:, None])
      np.testing.assert_array_equal(state_rows, unrolls)
    else:
      assert observation_ids.shape == (1, T * B // parts)
    seen.append(np.sort(observation_ids.ravel()))
  every = np.sort(ids[:, :T].ravel())  # never the bootstrap step
  for epoch in range(epochs):
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[epoch * parts:
                                                              (epoch + 1) * parts])), every)
  assert any((a != b).any() for a, b in zip(seen[:parts], seen[parts:2 * parts]))  # shuffled
  np.testing.assert_allclose(learner.last_unroll_uses, np.full(B, float(epochs)))
  assert learner.num_steps.numpy() == 1


def test_the_policy_stamps_the_learner_step_and_the_lag_is_measured():
  config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, hidden_sizes=(8,))
  builder, network, learner = _learner(config)
  policy = builder.make_policy(network, DISCRETE, 4, 4)
  obs = np.zeros((4, 4), np.float32)
  assert (policy.step(np.arange(4), obs, np.ones(4, bool), np.zeros(4, bool))
          .extras['policy_version'] == 0).all()
  for _ in range(2):
    metrics = learner.train_on(_batch(builder, DISCRETE))  # versions 0 in the batch
  assert metrics['policy_lag'] == 1.0  # trained at step 2 on data of step 0
  assert (policy.step(np.arange(4), obs, np.ones(4, bool), np.zeros(4, bool))
          .extras['policy_version'] == 2).all()


def test_the_learning_rate_falls_linearly_to_zero_over_the_decay_steps():
  """Each learner step trains at `learning_rate * (1 - steps done / decay steps)`,
  then 0 -- the rate the step's metrics report, and the one Adam applied: a step at
  rate 0 leaves every weight as it was."""
  config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, hidden_sizes=(8,),
                     learning_rate=1e-3, learning_rate_decay_steps=4)
  builder, network, learner = _learner(config)
  rates = [learner.train_on(_batch(builder, DISCRETE, seed=i))['learning_rate']
           for i in range(4)]
  np.testing.assert_allclose(rates, [1e-3, 7.5e-4, 5e-4, 2.5e-4], rtol=1e-6)
  weights = [v.numpy() for v in network.trainable_variables]
  assert learner.train_on(_batch(builder, DISCRETE, seed=9))['learning_rate'] == 0.0
  for before, after in zip(weights, network.trainable_variables):
    np.testing.assert_array_equal(before, after.numpy())


def test_the_kl_rule_divides_above_twice_the_target_multiplies_below_half_within_bounds():
  rule = lambda rate, kl: adapted_learning_rate(rate, kl, 0.01, 1.5, (1e-4, 1e-2))  # noqa: E731
  assert rule(1e-3, 0.021) == pytest.approx(1e-3 / 1.5)
  assert rule(1e-3, 0.0049) == pytest.approx(1.5e-3)
  for kl in (0.005, 0.01, 0.02, float('nan'), float('inf')):  # the band, or no measure
    assert rule(1e-3, kl) == 1e-3
  assert rule(1.2e-4, 0.5) == 1e-4 and rule(9e-3, 0.0) == 1e-2  # the bounds


def test_a_kl_target_adapts_the_rate_adam_applies_and_a_checkpoint_keeps_it(tmp_path):
  """With a KL target the rate a step reports is the one Adam applied (the first step's
  is `learning_rate`); the next is this step's rate moved by the step's own KL --
  down from a target far under it, up from one far over it -- and a fresh learner
  restores the adapted rate from a checkpoint. A scheduled rate is refused beside it."""
  def run(target, steps=3):
    config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2,
                       hidden_sizes=(8,), learning_rate=1e-3, kl_target=target)
    builder, _, learner = _learner(config)
    out = [learner.train_on(_batch(builder, DISCRETE, seed=i)) for i in range(steps)]
    return config, learner, out
  _, _, low = run(1e-9)  # every step's KL is above twice this
  assert all(m['proximal_approx_kl'] > 2e-9 for m in low)
  np.testing.assert_allclose([m['learning_rate'] for m in low],
                             [1e-3, 1e-3 / 1.5, 1e-3 / 1.5 ** 2], rtol=1e-5)
  config, learner, high = run(10.0)
  assert all(m['proximal_approx_kl'] < 5.0 for m in high)
  np.testing.assert_allclose([m['learning_rate'] for m in high],
                             [1e-3, 1.5e-3, 2.25e-3], rtol=1e-5)
  Checkpointer(str(tmp_path), learner.checkpoint_state(), 1).save(
      {'learner_steps': 3, 'env_steps': 0, 'episodes': 0})
  _, _, fresh = _learner(config)
  Checkpointer(str(tmp_path), fresh.checkpoint_state(), 1).restore()
  assert fresh._learning_rate.numpy() == pytest.approx(3.375e-3)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='learning_rate_decay_steps=490 schedules it.*exclusive'):
    PPOConfig(kl_target=0.01, learning_rate_decay_steps=490)
  with pytest.raises(ValueError, match='kl_target=0.0 must be > 0'):
    PPOConfig(kl_target=0.0)


def test_the_kl_ceiling_rule_cuts_above_it_raises_when_a_step_up_stays_under_it():
  rule = lambda scale, kl: ceiling_scale(scale, kl, 0.02, 1.2)  # noqa: E731
  assert rule(0.5, 0.021) == pytest.approx(0.5 / 1.2)
  assert rule(0.5, 0.0138) == pytest.approx(0.6)  # 0.0138 * 1.44 < 0.02
  for kl in (0.014, 0.02, float('nan'), float('inf')):  # the band, or no measure
    assert rule(0.5, kl) == 0.5
  assert rule(1.0, 0.0) == 1.0 and rule(0.051, 1.0) == 0.05  # 1 at most; the floor


def test_a_kl_ceiling_scales_the_schedule_adam_applies_and_a_checkpoint_keeps_it(tmp_path):
  """Under a ceiling each step trains at the scheduled rate times the scale, the rate
  the step reports: a ceiling far under every step's KL cuts the scale each step while
  the schedule decays, one far over it leaves the schedule as it is; a fresh learner
  restores the scale from a checkpoint. A KL target beside it is refused."""
  def run(ceiling, steps=3):
    config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, hidden_sizes=(8,),
                       learning_rate=1e-3, learning_rate_decay_steps=4, kl_ceiling=ceiling)
    builder, _, learner = _learner(config)
    out = [learner.train_on(_batch(builder, DISCRETE, seed=i)) for i in range(steps)]
    return config, learner, out
  low_config, low_learner, low = run(1e-9)
  assert all(m['proximal_approx_kl'] > 1e-9 for m in low)
  np.testing.assert_allclose([m['learning_rate'] for m in low],
                             [1e-3, 7.5e-4 / 1.2, 5e-4 / 1.44], rtol=1e-5)
  np.testing.assert_allclose([m['kl_scale'] for m in low], [1, 1 / 1.2, 1 / 1.44], rtol=1e-5)
  _, _, high = run(10.0)
  np.testing.assert_allclose([m['learning_rate'] for m in high], [1e-3, 7.5e-4, 5e-4],
                             rtol=1e-5)
  Checkpointer(str(tmp_path), low_learner.checkpoint_state(), 1).save(
      {'learner_steps': 3, 'env_steps': 0, 'episodes': 0})
  _, _, fresh = _learner(low_config)
  Checkpointer(str(tmp_path), fresh.checkpoint_state(), 1).restore()
  assert fresh._kl_scale.numpy() == pytest.approx(1 / 1.2 ** 3)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='kl_ceiling=0.02 must be > 0 and is exclusive'):
    PPOConfig(kl_ceiling=0.02, kl_target=0.01)
  with pytest.raises(ValueError, match='kl_ceiling=0.0 must be > 0'):
    PPOConfig(kl_ceiling=0.0)
  with pytest.raises(ValueError, match='kl_ceiling_factor=1.0 must be > 1'):
    PPOConfig(kl_ceiling=0.02, kl_ceiling_factor=1.0)


def test_continuous_actions_are_served_inside_the_bounds_and_greedy_is_the_mode():
  config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, squash='tanh',
                     init_log_std=1.0)
  builder = PPOBuilder(config)
  network = builder.make_networks(CONTINUOUS)
  policy = builder.make_policy(network, CONTINUOUS, 64, 64)
  obs = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32) * 100
  out = policy.step(np.arange(64), obs, np.ones(64, bool), np.arange(64) % 2 == 0)
  assert out.action.dtype == np.float32 and out.action.shape == (64, 2)
  assert (out.action >= [-1.0, -2.0]).all() and (out.action <= [1.0, 0.5]).all()
  again = policy.step(np.arange(64), obs, np.ones(64, bool), np.arange(64) % 2 == 0)
  np.testing.assert_array_equal(again.action[::2], out.action[::2])  # greedy: the mode
  assert (again.action[1::2] != out.action[1::2]).any()  # sampled


def _kernel_shapes(network, torso):
  return [tuple(v.shape) for v in network.trainable_variables
          if f'{torso}_torso' in v.name and v.name.endswith('w:0')]


@pytest.mark.parametrize('value_sizes', [None, (32, 16)])
def test_the_value_mlp_takes_its_own_sizes_and_the_policy_keeps_its_own(value_sizes):
  config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, hidden_sizes=(8, 8),
                     value_hidden_sizes=value_sizes)
  network = PPOBuilder(config).make_networks(CONTINUOUS)
  network.unroll(tf.zeros((4, 2, 5)), tf.zeros((4, 2), tf.bool))
  assert _kernel_shapes(network, 'policy') == [(5, 8), (8, 8)]
  assert _kernel_shapes(network, 'value') == (
      [(5, 8), (8, 8)] if value_sizes is None else [(5, 32), (32, 16)])


@pytest.mark.parametrize('overrides', [dict(value_hidden_sizes=()),
                                       dict(value_hidden_sizes=(0, 8)),
                                       dict(value_hidden_sizes=256),
                                       dict(value_hidden_sizes='wide'),
                                       dict(value_hidden_sizes=(8.5,)),
                                       dict(value_hidden_sizes=(8,), shared_torso=True),
                                       dict(value_hidden_sizes=(8,), core='lstm'),
                                       dict(value_hidden_sizes=(8,), torso='nature_cnn')])
def test_value_sizes_that_would_be_ignored_or_cannot_build_are_refused(overrides):
  with pytest.raises(ValueError, match='value_hidden_sizes='):
    PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, **overrides)


def test_normalizer_is_shared_reaches_actor_side_copies_and_checkpoints(tmp_path):
  config = PPOConfig(unroll_length=5, batch_size=4, num_minibatches=2,
                     normalize_observations=True, hidden_sizes=(8,))
  builder, network, learner = _learner(config, CONTINUOUS)
  # The action mean's layer starts at gain 0.01, so the served action's dependence on
  # the input could fall under the 1e-3 the test asks below (1.8e-4 in a Bazel run);
  # at gain 0.3 the action follows its input as a trained policy's does.
  network.head._mean.w.assign(network.head._mean.w * 30.0)  # pylint: disable=protected-access
  policy = builder.make_policy(network, CONTINUOUS, 4, 4)
  for step in range(3):
    learner.train_on(_batch(builder, CONTINUOUS, seed=step, observation_scale=(1.5, 2.0)))
  stats = network.normalizer
  assert stats.count.numpy() == 3 * 4 * 5  # T transitions of every unroll, per step
  assert np.abs(stats.mean.numpy()).max() > 0.5  # a probe's normalized input differs
  probe = np.full((1, 5), 2.0, np.float32)

  def served_and_expected():
    """What the policy serves for `probe` (greedy), and what the network gives for the
    probe normalized here by hand with the statistics' current values, and raw."""
    out = policy.step(np.arange(1), probe, np.ones(1, bool), np.ones(1, bool))
    by_hand = (probe - stats.mean.numpy()) / np.sqrt(stats.var.numpy() + 1e-8)
    heads = lambda x: network._feed_forward(tf.constant(x, tf.float32))  # noqa: E731
    (params, value), (raw_params, raw_value) = heads(by_hand), heads(probe)
    mode = lambda p: network.head.to_env(network.head.mode(p)).numpy()  # noqa: E731
    return (out.action, out.extras['value']), (mode(params), value.numpy()), \
        (mode(raw_params), raw_value.numpy())

  # Inference reads the learner's variables: what it serves is the network on the input
  # normalized with the statistics as they are now, not on the raw input.
  for step in range(2):
    served, expected, raw = served_and_expected()
    for got, want, unnormalized in zip(served, expected, raw):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
      assert np.abs(got - unnormalized).max() > 1e-3
    if step == 0:  # the statistics move with the next learner step; inference follows
      mean_before = stats.mean.numpy().copy()
      learner.train_on(_batch(builder, CONTINUOUS, seed=7, observation_scale=(4.0, 3.0)))
      assert np.abs(stats.mean.numpy() - mean_before).max() > 0.1
  # Actor-side inference copies `policy_network(...).variables`: statistics included.
  copy = builder.make_networks(CONTINUOUS)
  for mine, theirs in zip(builder.policy_network(copy).variables,
                          builder.policy_network(network).variables):
    mine.assign(theirs)
  np.testing.assert_array_equal(copy.normalizer.mean.numpy(), stats.mean.numpy())
  # A checkpoint brings them back into a fresh learner.
  Checkpointer(str(tmp_path), learner.checkpoint_state(), 1).save(
      {'learner_steps': 4, 'env_steps': 0, 'episodes': 0})
  _, fresh, fresh_learner = _learner(config, CONTINUOUS)
  Checkpointer(str(tmp_path), fresh_learner.checkpoint_state(), 1).restore()
  for name in ('count', 'mean', 'var'):
    np.testing.assert_array_equal(getattr(fresh.normalizer, name).numpy(),
                                  getattr(stats, name).numpy())


@pytest.mark.parametrize('estimator', ['gae', 'vtrace'])
def test_a_truncated_episode_bootstraps_and_a_terminated_one_does_not(estimator):
  config = PPOConfig(unroll_length=6, batch_size=2, num_minibatches=1, gae_lambda=0.9,
                     advantage_estimator=estimator, hidden_sizes=(8,))
  builder, _, learner = _learner(config)
  step_type = np.full((2, 7), MID, np.int8)
  step_type[:, 0] = FIRST
  step_type[:, 3] = LAST  # episode ends at step 3; step 4 starts the next one
  step_type[:, 4] = FIRST
  discount = np.ones((2, 7), np.float32)
  discount[1, 3] = 0.0  # unroll 0: time-limit truncation (discount 1); 1: termination

  def advantage_at_2(observation_at_3):
    batch = _batch(builder, DISCRETE, step_type=step_type, discount=discount)
    observation = batch['observation'].numpy()
    observation[:, 3] = observation_at_3
    batch['observation'] = tf.constant(observation)
    advantages, _ = learner.advantages(batch)
    return advantages[2]  # transition x_2 -> x_3 (LAST), per unroll

  a, b = advantage_at_2(0.0), advantage_at_2(5.0)
  assert abs(a[0] - b[0]) > 1e-4  # truncation: the last observation's value counts
  assert a[1] == pytest.approx(b[1], abs=1e-6)  # termination: it does not
  advantages, _ = learner.advantages(_batch(builder, DISCRETE, step_type=step_type,
                                            discount=discount))
  np.testing.assert_array_equal(advantages[3], 0.0)  # the LAST -> FIRST pair: no transition


def test_a_non_finite_loss_raises_before_anything_is_applied():
  config = PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2, hidden_sizes=(8,))
  builder, network, learner = _learner(config)
  before = [v.numpy().copy() for v in network.trainable_variables]
  reward = np.full((4, 5), np.nan, np.float32)
  with pytest.raises(DivergedError, match='non-finite PPO loss'):
    learner.train_on(_batch(builder, DISCRETE, reward=reward))
  for old, v in zip(before, network.trainable_variables):
    np.testing.assert_array_equal(old, v.numpy())
  assert learner.num_steps.numpy() == 0


class _RecordingBuilder(PPOBuilder):
  """Keeps the network the central node builds (to poison it)."""

  def make_networks(self, spec):
    self.network = super().make_networks(spec)
    return self.network


@pytest.mark.timeout(120)
def test_actions_outside_the_bounds_stop_the_run_as_diverged(tmp_path):
  """A diverged policy's NaN actions never reach an env: the run stops, summarized."""
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
  from seedacme.nodes.central import CentralNode  # pylint: disable=g-import-not-at-top
  from seedacme.wire.protocol import make_request  # pylint: disable=g-import-not-at-top
  import reverb  # pylint: disable=g-import-not-at-top
  factory = envs.make_factory('mujoco', level='HalfCheetah-v5')
  env = factory(0)
  spec = envs.env_spec_of(env)
  builder = _RecordingBuilder(PPOConfig(unroll_length=4, batch_size=4, num_minibatches=2))
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  stop = threading.Event()
  config = ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0,
                         logdir=str(tmp_path), max_seconds=60, checkpoint_interval_s=None)
  central = CentralNode(builder, spec, config, reverb.Client(f'localhost:{server.port}'),
                        stop_event=stop)
  try:
    run = threading.Thread(target=central.run, daemon=True)
    run.start()
    obs = np.stack([env.reset().observation] * 2)
    request = lambda: make_request(np.arange(2), np.ones(2), obs, np.zeros(2),  # noqa: E731
                                   np.ones(2), np.full(2, FIRST))
    assert 'action' in central.step(request())
    for v in builder.network.head.variables:  # a diverged policy: NaN means
      v.assign(tf.fill(v.shape, np.nan))
    reply = central.step(request())
    assert 'shutting_down' in reply and 'non-finite action' in reply['shutting_down']
    run.join(30)
    assert not run.is_alive()
  finally:
    stop.set()
    central.shutdown()
    server.stop()
  with open(os.path.join(str(tmp_path), 'summary.json')) as f:
    summary = json.load(f)
  assert summary['stop']['kind'] == 'diverged'
  assert 'non-finite action' in summary['stopped_because']


@pytest.mark.timeout(150)
def test_returns_rise_on_cartpole(make_central, learn_until):
  config = PPOConfig(unroll_length=32, batch_size=16, epochs=4, num_minibatches=4,
                     learning_rate=1e-3, entropy_cost=0.01, reward_scale=0.1)
  central, _, actors, _ = make_central(PPOBuilder(config), env='cartpole', num_actors=2,
                                       envs_per_actor=8)
  for a in actors:
    a.start()
  first, summary = learn_until(central, 200, first_after_episodes=50, timeout_s=120)
  assert first is not None
  assert summary['average_return'] >= 200 > first, (first, summary)
  assert all(a.error is None for a in actors)
