"""Hyperparameters of the PPO agent (one dataclass; flags live in launchers).

Defaults are CleanRL's / "What Matters in On-Policy RL" (Andrychowicz et al., 2020)
choices where they apply to a SEED queue: clip 0.2, GAE lambda 0.95, Adam with epsilon
1e-5, global gradient norm 0.5, advantages normalized per minibatch, separate tanh MLPs
for policy and value on vector observations. Per-env settings live in the registry.

One default is not CleanRL's: the objective. CleanRL trains on data of the policy it
clips against; here the data is several learner steps old, so the clip is centred on
the proximal policy and the behaviour policy corrected by a truncated importance
weight (`objective='decoupled'`; `'clip'` is CleanRL's). On CartPole (2 x 8 envs, lag
~1 step, 3 runs each, alternating, load 2-5) the greedy evaluator reached 475 after
49-58k env steps (31-57 s) with it and 53-55k (41-63 s) with 'clip' (issue 36).
"""

import dataclasses
from typing import Tuple

from seedacme.config import check_scalar_fields

CORES = ('feedforward', 'lstm')
OBJECTIVES = ('decoupled', 'clip')
ADVANTAGE_ESTIMATORS = ('gae', 'vtrace')
SQUASHES = ('tanh', 'clip')
NORMALIZER_UPDATES = ('after_epochs', 'on_arrival')
KL_CEILING_MIN_SCALE = 0.05  # the lowest share of the scheduled rate a KL ceiling keeps


@dataclasses.dataclass
class PPOConfig:
  """PPO settings.

  Attributes:
    unroll_length: T, transitions per unroll (unrolls hold T + 1 steps: bootstrap).
    batch_size: unrolls per learner step (one batch off the queue).
    epochs: passes over each learner batch.
    num_minibatches: minibatches per epoch. Feed-forward cores shuffle transitions
      (`batch_size * unroll_length` must divide by it), LSTM cores whole unrolls
      (`batch_size` must: their state runs through).
    queue_size: Reverb queue capacity in unrolls; a full queue blocks inference. The
      learner samples no further ahead than this (at most a batch). With a queue of a
      batch, one batch waits in the queue and one is sampled ahead while the learner
      trains: the envs act up to ~4 learner steps ahead of it (Pong, 32 envs, batch 32:
      lag 3.8-4.0). With a queue much smaller than a batch, a round of unrolls reaches
      the learner only as it asks for its next batch, and the envs' next round starts
      then: the data the learner trains on were acted while it trained on the previous
      batch (lag ~1: 0.92 in the same 200-s probe, at the same learner steps per second).
    core: 'feedforward' or 'lstm' (torso -> LSTM -> heads, shared).
    torso: 'mlp', 'nature_cnn', 'impala_resnet' or 'football' (seedacme.networks).
    hidden_sizes, activation: the MLP torso ('tanh' or 'relu').
    value_hidden_sizes: the value MLP's sizes when it has its own torso (None: as
      `hidden_sizes`). "What Matters in On-Policy RL" recommends a value MLP wider
      than the policy's.
    shared_torso: one torso for policy and value; False gives each its own MLP (the
      default for vector observations; frames always share the CNN).
    lstm_size: LSTM core size.
    squash: continuous actions: 'tanh' (squashed Normal) or 'clip' (Normal, clipped
      into the bounds: CleanRL's PPO); discrete actions ignore it.
    init_log_std: initial state-independent log standard deviation.
    learning_rate, adam_epsilon, max_gradient_norm: Adam and global-norm clipping.
    learning_rate_decay_steps: anneal the learning rate linearly to 0 over this many
      learner steps (0: constant).
    kl_target: adapt the learning rate to a KL target, as rl_games's 'adaptive' schedule
      (None: off, the default). After each learner step, with the step's mean KL from
      the proximal policy to the network as each minibatch found it
      (`proximal_approx_kl`): above `2 * kl_target` the rate is divided by
      `kl_rate_factor`, below `kl_target / 2` multiplied by it, kept within
      `kl_rate_bounds`. It starts at `learning_rate` and is checkpointed. Exclusive
      with a decay (`learning_rate_decay_steps`, `anneal_to_budget`): give
      `learning_rate_decay_steps=0` with it where the env's defaults anneal (MuJoCo).
    kl_rate_factor, kl_rate_bounds: the adaptation's step and the rate's bounds.
    kl_ceiling: keep the step's KL from the proximal policy under this (None: off, the
      default), with or without a decay: the rate each step trains at is the scheduled
      one times a scale <= 1. After a step whose `proximal_approx_kl` passed the
      ceiling the scale is divided by `kl_ceiling_factor`; after one whose KL times the
      factor squared stayed under it (a rate `factor` times higher moves the KL by about
      its square: Ant-v5's run-mean KL was 0.017 / 0.029 / 0.047 at rates 3e-4 / 4e-4 /
      5e-4), multiplied, up to 1; never below `KL_CEILING_MIN_SCALE`. Checkpointed.
      Unlike `kl_target` it only slows a task whose updates run past the ceiling, and
      leaves the schedule to the others. Exclusive with `kl_target`.
    kl_ceiling_factor: the scale's step.
    anneal_to_budget: when the run has an env-step budget (`--max_env_steps`) and
      `learning_rate_decay_steps` is 0, the rate reaches 0 at the budget: the decay
      steps become the learner steps the budget holds (`with_budget`), as CleanRL
      anneals over its total_timesteps. Without a budget the rate stays constant.
    discount, gae_lambda: gamma and lambda.
    advantage_estimator: 'gae', or 'vtrace' (V-trace-corrected, for stale unrolls).
    recompute_advantages: recompute advantages with the current network each epoch.
    normalize_advantages: per minibatch, over its real transitions.
    objective: 'decoupled' (default; Hilton et al. 2021: the clip centred on the proximal
      policy, the network as each learner batch arrives, and the behaviour policy
      corrected by the weight min(behaviour_weight_clip, pi_prox / mu)) or 'clip'
      (plain PPO-clip, centred on the behaviour policy, several learner steps old here).
    behaviour_weight_clip: c_bar of the decoupled objective's behaviour weight. 1.0,
      V-trace's rho_bar: the lagging data's correction is truncated where the
      advantage estimator's would be (the paper's code clips pi/mu at 100, for
      numerical safety only, on artificially stale data).
    clip_epsilon: the surrogate's clip; value_clip: PPO2's value clip (None: off),
      centred on the values of the same policy as the surrogate's clip.
    baseline_cost, entropy_cost: weights of the value loss and the entropy bonus.
    normalize_observations: running mean/std of observations (checkpointed with the
      network; inference and learner read the same statistics), clipped to
      +-observation_clip.
    normalizer_update: when the learner adds a batch's observations to the
      statistics: 'after_epochs' (default: with the new weights, so the statistics
      change with the policy's version and data of zero lag is evaluated exactly as
      it was acted on) or 'on_arrival' (before the batch's log-probs: the first
      implementation, kept to measure what the change is worth).
    normalize_rewards: divide rewards by the running std of discounted returns
      (CleanRL's NormalizeReward), clipped to +-reward_norm_clip.
    carry_reward_returns: each env's discounted return runs on across its unrolls
      (default, as gymnasium's NormalizeReward over an episode; Hopper-v5 at 1M, 3 seeds
      side by side: median 3,106 with it, 2,206 without); False restarts it at every
      unroll (the first implementation, kept for comparison). The carried
      returns are not checkpointed: after a resume each env's starts again at 0, as
      at the start of a run (actors restart their episodes unless they re-attach; the
      running std itself is checkpointed, so one unroll's smaller returns move it little).
    reward_clip, reward_scale: clip rewards (Atari: 1), then scale.
  """
  unroll_length: int = 64
  batch_size: int = 16
  epochs: int = 4
  num_minibatches: int = 4
  queue_size: int = 16
  core: str = 'feedforward'
  torso: str = 'mlp'
  hidden_sizes: Tuple[int, ...] = (64, 64)
  value_hidden_sizes: Tuple[int, ...] | None = None
  activation: str = 'tanh'
  shared_torso: bool = False
  lstm_size: int = 128
  squash: str = 'clip'
  init_log_std: float = 0.0
  learning_rate: float = 3e-4
  adam_epsilon: float = 1e-5
  max_gradient_norm: float | None = 0.5
  learning_rate_decay_steps: int = 0
  anneal_to_budget: bool = False
  kl_target: float | None = None
  kl_rate_factor: float = 1.5
  kl_rate_bounds: Tuple[float, float] = (1e-6, 1e-2)
  kl_ceiling: float | None = None
  kl_ceiling_factor: float = 1.2
  discount: float = 0.99
  gae_lambda: float = 0.95
  advantage_estimator: str = 'gae'
  recompute_advantages: bool = False
  normalize_advantages: bool = True
  objective: str = 'decoupled'
  behaviour_weight_clip: float = 1.0
  clip_epsilon: float = 0.2
  value_clip: float | None = None
  baseline_cost: float = 0.5
  entropy_cost: float = 0.0
  normalize_observations: bool = False
  observation_clip: float = 10.0
  normalizer_update: str = 'after_epochs'
  normalize_rewards: bool = False
  carry_reward_returns: bool = True
  reward_norm_clip: float = 10.0
  reward_clip: float | None = None
  reward_scale: float = 1.0
  seed: int = 0

  @property
  def separate_value_torso(self) -> bool:
    """The value has its own MLP: vector observations, feed-forward, `shared_torso` off."""
    return not self.shared_torso and self.torso == 'mlp' and self.core != 'lstm'

  @property
  def minibatch_items(self) -> int:
    """What minibatches split: whole unrolls (LSTM) or transitions (feed-forward)."""
    return self.batch_size * (1 if self.core == 'lstm' else self.unroll_length)

  def with_budget(self, env_steps: int | None) -> 'PPOConfig':
    """This config for a run of `env_steps` env steps: with `anneal_to_budget` and no
    decay steps given, the learning rate falls to 0 over the learner steps the budget
    holds (each takes `batch_size` unrolls of `unroll_length`)."""
    if not (self.anneal_to_budget and env_steps and self.learning_rate_decay_steps == 0):
      return self
    steps = max(1, int(env_steps) // (self.batch_size * self.unroll_length))
    return dataclasses.replace(self, learning_rate_decay_steps=steps)

  def __post_init__(self):
    check_scalar_fields(self)
    checks = ((self.core in CORES, f'core={self.core!r}: choose one of {CORES}'),
              (self.advantage_estimator in ADVANTAGE_ESTIMATORS,
               f'advantage_estimator={self.advantage_estimator!r}: choose one of '
               f'{ADVANTAGE_ESTIMATORS}'),
              (self.objective in OBJECTIVES,
               f'objective={self.objective!r}: choose one of {OBJECTIVES}'),
              (self.behaviour_weight_clip > 0,
               f'behaviour_weight_clip={self.behaviour_weight_clip} must be > 0'),
              (self.normalizer_update in NORMALIZER_UPDATES,
               f'normalizer_update={self.normalizer_update!r}: choose one of '
               f'{NORMALIZER_UPDATES}'),
              (self.squash in SQUASHES, f'squash={self.squash!r}: choose one of {SQUASHES}'),
              (self.activation in ('tanh', 'relu'),
               f"activation={self.activation!r}: choose 'tanh' or 'relu'"),
              (self.epochs >= 1 and self.num_minibatches >= 1,
               f'epochs={self.epochs} and num_minibatches={self.num_minibatches} must '
               'be >= 1'),
              (self.minibatch_items % self.num_minibatches == 0,
               f'{self.minibatch_items} {"unrolls" if self.core == "lstm" else "transitions"}'
               f' per batch must divide by num_minibatches={self.num_minibatches} (each '
               'is used exactly `epochs` times)'),
              (self.queue_size >= 1, f'queue_size={self.queue_size} must be >= 1'),
              (self.value_hidden_sizes is None or (
                  self.separate_value_torso
                  and isinstance(self.value_hidden_sizes, (tuple, list))
                  and len(self.value_hidden_sizes) >= 1
                  and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                          for n in self.value_hidden_sizes)),
               f'value_hidden_sizes={self.value_hidden_sizes} must be None or one or more '
               'sizes >= 1, and needs a value MLP of its own (shared_torso=False, '
               f"torso='mlp', core='feedforward'; here shared_torso={self.shared_torso}, "
               f'torso={self.torso!r}, core={self.core!r})'),
              (self.kl_target is None or self.kl_target > 0,
               f'kl_target={self.kl_target} must be > 0 (None: a scheduled rate)'),
              (self.kl_target is None or not (self.learning_rate_decay_steps
                                              or self.anneal_to_budget),
               f'kl_target={self.kl_target} adapts the learning rate, and '
               + ' and '.join(f'{k}={v}' for k, v in (
                   ('learning_rate_decay_steps', self.learning_rate_decay_steps),
                   ('anneal_to_budget', self.anneal_to_budget)) if v)
               + ' schedules it: the two are exclusive (add learning_rate_decay_steps=0 '
               'and anneal_to_budget=False)'),
              (self.kl_ceiling is None or (self.kl_ceiling > 0 and self.kl_target is None),
               f'kl_ceiling={self.kl_ceiling} must be > 0 and is exclusive with kl_target'
               f'={self.kl_target} (both set the rate)'),
              (self.kl_ceiling_factor > 1,
               f'kl_ceiling_factor={self.kl_ceiling_factor} must be > 1'),
              (self.kl_rate_factor > 1 and 0 < self.kl_rate_bounds[0]
               <= self.kl_rate_bounds[1],
               f'kl_rate_factor={self.kl_rate_factor} must be > 1 and kl_rate_bounds='
               f'{self.kl_rate_bounds} a (low, high) pair with 0 < low <= high'))
    for ok, message in checks:
      if not ok:
        raise ValueError(f'PPOConfig: {message}')
