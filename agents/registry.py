"""Agents by name, with per-environment defaults (what `run_local <env> <agent>` uses).

Declarative: an agent is one `AgentEntry` -- its name, where its builder and config
dataclass live, its per-env defaults (and per task, where a task's published run
needed other settings), options for its training envs and an optional fit to the
program's size -- and one `register_agent` line at the bottom of this file.
`run_local`, the Vertex launcher, benchmarks and tests all build agents through
`make_builder` (its config: `make_config`). Builder and config are
named as 'module:attribute' and imported only when used, so a launcher that parses
flags does not import TensorFlow.
"""

import dataclasses
import importlib
from typing import Any, Callable, Dict, Mapping, Tuple

from seedacme.builder import SeedBuilder


@dataclasses.dataclass(frozen=True)
class AgentEntry:
  """One agent: name -> builder, config dataclass, per-env defaults.

  Attributes:
    name: the agent's name on the command line.
    builder: the builder class, or 'module:Class'; called with a config.
    config: the config dataclass, or 'module:Class'; called with keyword overrides.
    env_defaults: per environment name, overrides of the config's defaults.
    fit: `fit(kwargs, num_train_envs, overrides, env) -> kwargs`: adapts the defaults
      to the program's size (explicit overrides always win).
    task_defaults: per environment name, per task (MuJoCo level, Atari game, Football
      scenario), overrides of the env's defaults: what that task's published run used.
    train_env_defaults: per environment name, env factory options for the training
      envs only (the evaluator's envs never get them; `--env_config` overrides them).
  """
  name: str
  builder: Any
  config: Any
  env_defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  fit: Callable[[Dict[str, Any], int, Dict[str, Any], str], Dict[str, Any]] | None = None
  train_env_defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(
      default_factory=dict)
  task_defaults: Mapping[str, Mapping[str, Mapping[str, Any]]] = dataclasses.field(
      default_factory=dict)


_AGENTS: Dict[str, AgentEntry] = {}


def register_agent(entry: AgentEntry) -> None:
  """Makes `entry.name` known to every launcher (a later entry of that name replaces it)."""
  _AGENTS[entry.name] = entry


def agent_names() -> Tuple[str, ...]:
  return tuple(_AGENTS)


def _load(target: Any) -> Any:
  if not isinstance(target, str):
    return target
  module, _, attribute = target.partition(':')
  return getattr(importlib.import_module(module), attribute)


def config_class(agent: str) -> Any:
  """The config dataclass of `agent`."""
  return _load(_entry(agent).config)


def _entry(agent: str) -> AgentEntry:
  try:
    return _AGENTS[agent]
  except KeyError:
    raise ValueError(f'Unknown agent {agent!r}; known: {", ".join(_AGENTS)}') from None

# Per-environment overrides of the agent's config dataclass.
_VTRACE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'catch': dict(core='feedforward', hidden_sizes=(64, 64), unroll_length=20, batch_size=32,
                  learning_rate=1e-3, entropy_cost=0.01),
    'cartpole': dict(core='feedforward', hidden_sizes=(64, 64), unroll_length=20,
                     batch_size=32, learning_rate=1e-3, entropy_cost=0.01,
                     reward_scale=0.1),
    # Atari/DMLab: rewards clipped in the loss; envs report raw scores.
    # Feed-forward Nature CNN: what 2 CPU cores can train; SEED's own choice is
    # torso='impala_resnet' with core='lstm' (set them for accelerator runs).
    # adam_epsilon=1e-3: with Adam's default 1e-7 every parameter moves ~lr per step
    # however tiny its gradient, and on Pong the consistent early pull of the value
    # towards its mean return (~-2) drove every unit of the first conv layer below zero
    # for every frame: after 16k updates (2.5M env steps) the torso was dead, the
    # policy state-independent and returns flat at random's -20.3. The larger epsilon
    # scales small gradients down instead (SGD-like); on its own it only slowed the
    # dying, together with the Nature CNN's orthogonal init (seedacme/networks.py) Pong
    # learns (README, "Pong learns"; tests/unit/test_atari_vtrace_torso.py).
    # optimizer='rmsprop': IMPALA's TF1 RMSprop (agents/vtrace/optimizers.py). Adam with
    # epsilon 1e-3 kept conv0 alive but moved the heads 4-5x less per update; with
    # RMSprop Pong's training average left random's at ~1.2M env steps instead of ~2.0M
    # and passed 0 at 2.3M (README, "Pong learns"; bench/optimizer_probe.py).
    # batch_size 8, queue_size 32: on 2 cores batch 8 gives 4x the updates for the same
    # frames, and a full queue is the policy lag: 32 unrolls are 4 updates (256: 32).
    'atari': dict(core='feedforward', torso='nature_cnn', reward_clip=1.0, discount=0.99,
                  optimizer='rmsprop', learning_rate=6e-4, adam_epsilon=1e-3,
                  entropy_cost=0.01, unroll_length=20, batch_size=8, queue_size=32),
    'dmlab': dict(core='lstm', torso='impala_resnet', lstm_size=256, reward_clip=1.0),
    # MuJoCo through the shared tanh-Normal head (seedacme/distributions.py), with
    # running observation normalization; rewards scaled to keep values near 1.
    'mujoco': dict(core='feedforward', hidden_sizes=(256, 256), unroll_length=32,
                   batch_size=16, queue_size=64, learning_rate=3e-4, entropy_cost=0.0,
                   reward_scale=0.1, normalize_observations=True, squash='tanh'),
    # Football (stacked SMM): SEED's feed-forward 4-stack ResNet, unroll and discount;
    # a learning rate and entropy cost for short runs (SEED's are tuned for 500M frames).
    'football': dict(core='feedforward', torso='football', unroll_length=32, batch_size=16,
                     discount=0.997, learning_rate=3e-4, entropy_cost=0.003),
}

# R2D2 on small control tasks: short sequences, frequent target updates.
_R2D2_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'catch': dict(burn_in=2, trace_length=10, period=5, n_step=3, discount=0.99,
                  hidden_sizes=(64,), lstm_size=64, learning_rate=1e-3, batch_size=32,
                  target_update_period=100, replay_size=20_000, min_replay_size=200),
    'cartpole': dict(burn_in=8, trace_length=20, period=10, n_step=5, discount=0.99,
                     hidden_sizes=(64,), lstm_size=64, learning_rate=1e-3, batch_size=32,
                     target_update_period=200, replay_size=20_000, min_replay_size=500),
    # Atari on 2 CPU cores (paper values in brackets; docs/atari.md, "R2D2 on Pong").
    # A sequence costs ~0.14 ms per frame forward (online and target nets over every
    # frame) and ~0.27 ms per trained frame backward (from V-trace's
    # Nature CNN step), so the paper's batch of 64 x (40 + 80 + 1) frames would take ~3.5
    # s a step here. Shorter sequences [burn-in 40, trace 80, period 40] -> 10 / 20 / 10
    # over frame stacks (the stack carries the short-term memory; the burn-in only
    # warms the stored LSTM state), LSTM 256 [512].
    # Batch 8 [64], Adam 2.5e-4 [1e-4] with epsilon 1e-4 [1e-3]: on Pong the gradient's
    # RMS per parameter is 1e-5 to 7e-5 (`learner_grad_rms`), below the paper's epsilon,
    # so with it Adam moved a parameter ~1-7 % of the learning rate per step. With batch
    # 16 and the paper's optimizer, 5M env steps (31k steps) ended at -20.7, Q still
    # learning the losing policy's values; batch 8 gives twice the steps for the same
    # frames and this optimizer ~20x the step: Pong's training average left random at
    # ~1.0M env steps, passed 0 at 3.7M and +10 at 4.2M (docs/atari.md).
    # samples_per_insert 1: each env step is trained on about twice (trace 20 over
    # period 10; DQN's and Acme's R2D2 defaults: ~8 times, which would cost 4x the
    # wall-clock per env step here), and acting waits for the learner instead of filling
    # the replay with data it never trains on. Target copied every 400 learner steps
    # [2,500] = 64k trained transitions, near DQN's 80k. Replay 25k sequences (250k env
    # steps) and a checkpoint every 10 minutes: the table is GBs.
    'atari': dict(torso='nature_cnn', lstm_size=256, reward_clip=1.0, burn_in=10,
                  trace_length=20, period=10, batch_size=8, learning_rate=2.5e-4,
                  adam_epsilon=1e-4, target_update_period=400,
                  samples_per_insert=1.0, replay_size=25_000, min_replay_size=1_000,
                  replay_checkpoint_interval_s=600.0),
}


# PPO (agents/ppo), against CleanRL's ppo_continuous_action.py and ppo_atari.py.
# CleanRL's, from PPOConfig's defaults: clip 0.2, GAE lambda 0.95, gamma 0.99, Adam
# eps 1e-5, grad norm 0.5, value cost 0.5, advantages normalized per minibatch, separate
# 64-64 tanh MLPs on vector observations. Ours, unlike CleanRL: the objective
# (PPOConfig's 'decoupled', CleanRL's is plain 'clip': our data is learner steps old), a
# batch of `batch_size` unrolls off the queue from many envs instead of one rollout of N
# envs x T steps, and no value clip on vector observations (CleanRL clips the value with
# its clip coefficient, clip_vloss).
_PPO_DEFAULTS: Dict[str, Dict[str, Any]] = {
    # Ours (not CleanRL's): small tasks, short unrolls.
    'catch': dict(unroll_length=20, batch_size=16, epochs=4, num_minibatches=4,
                  queue_size=16, learning_rate=1e-3, entropy_cost=0.01,
                  activation='relu'),
    'cartpole': dict(unroll_length=32, batch_size=16, epochs=4, num_minibatches=4,
                     queue_size=16, learning_rate=1e-3, entropy_cost=0.01,
                     reward_scale=0.1),
    # MuJoCo, the published runs' settings (bench/published/mujoco_ppo_*_lr4e4.json;
    # HalfCheetah's own in `_PPO_TASK_DEFAULTS`).
    # CleanRL's: 2048 transitions per update, 32 minibatches of 64, 10 epochs, lr 3e-4
    # annealed linearly to 0, entropy 0, actions clipped into the bounds, observations
    # and rewards normalized (clip 10). Ours: the 2048 are 16 unrolls x 128 from 16
    # envs (CleanRL: 1 env x 2048); the learning rate reaches 0 after 490 learner steps
    # x 2048 env steps ~ 1M env steps (CleanRL: 1M // 2048 = 488 updates); the
    # normalizers' statistics move with the learner, not an env wrapper; no value clip
    # (CleanRL: 0.2); training envs start at random phases (`_PPO_TRAIN_ENVS`).
    # Learning rate 4e-4, not CleanRL's 3e-4 (issue 51, medians at 1M on one Intel Xeon):
    # Walker2d-v5 3,941 of 6 seeds (3e-4: 2,787, three seeds near 1,800), Hopper-v5
    # 2,651 of seeds 0-2 (3e-4: 2,537; 2,729 of 6), HalfCheetah-v5 with its entry 5,474
    # (5,193), Ant-v5 2,118 of 9 seeds, seeds 0-2 1,876 (3e-4 on the same machine: 1,751
    # of seeds 0-2); 5e-4 collapsed Ant's entropy (1,254 / 891). CleanRL's initial
    # action std 1 and 10 epochs for any task without its own entry (std 0.5 held
    # Hopper at 715; 4 epochs: 2,310).
    'mujoco': dict(unroll_length=128, batch_size=16, epochs=10, num_minibatches=32,
                   queue_size=16, learning_rate=4e-4, learning_rate_decay_steps=490,
                   entropy_cost=0.0, normalize_observations=True, normalize_rewards=True,
                   squash='clip'),
    # Atari: the published Pong runs' settings (bench/published/pong_learning_ppo_e3_s2.json,
    # 2 x 16 envs): one learner batch per round of the training envs -- batch_size 32
    # unrolls of 128, num_minibatches 16 of 256 transitions -- fitted to smaller
    # programs by `_fit_ppo_round` (CleanRL's 8 envs -> its 8 x 128 in 4 minibatches),
    # and a queue of one unroll, so the envs act one round ahead of the learner (policy
    # lag ~1 learner step, against 3.8 with a queue of a batch: PPOConfig.queue_size).
    # Entropy cost 0.003 (the training average is the stochastic policy's): +18 at 1.23M
    # env steps on seed 2, 1.35M on seed 0, 1.29M on seed 1 (pong_learning_ppo_e3_s*.json);
    # with CleanRL's 0.01 seeds 2 and 0 levelled off below +18 by 1.5M (best +17.0,
    # +17.9: pong_learning_ppo_q1_s{2,0}.json; seed 1 reached +18 at 1.21M, q1_s1).
    # Earlier: a queue of 32, +18 at 1.39M (pong_learning_ppo_b32.json); 8-unroll
    # batches off the 32 envs (the first defaults, pong_learning_ppo.json): 2.43M.
    # CleanRL's: shared Nature CNN, 8 x 128 transitions per update, 4 minibatches x 4
    # epochs, clip 0.1, value clip 0.1 (clip_vloss with the same coefficient), lr
    # 2.5e-4, entropy 0.01, rewards clipped to +-1. Ours: entropy 0.003 (above), objective
    # 'clip' (a decoupled Pong run was not faster: -1.4 at 1.30M env steps where clip was
    # at +15, pong_learning_ppo_decoupled.json), a constant learning rate (CleanRL anneals
    # it over 10M env steps; annealed over a 1.5M budget, `anneal_to_budget`, seed 0 was
    # slower: +16.8 best, -15 at 768k, pong_learning_ppo_lra_s0.json), rewards clipped
    # in the loss (envs report raw scores), no end of episode at a life lost (CleanRL's
    # EpisodicLifeEnv) and no FIRE reset.
    'atari': dict(torso='nature_cnn', shared_torso=True, unroll_length=128, batch_size=32,
                  epochs=4, num_minibatches=16, queue_size=1, learning_rate=2.5e-4,
                  objective='clip', clip_epsilon=0.1, value_clip=0.1, entropy_cost=0.003,
                  reward_clip=1.0),
}

# PPO per MuJoCo level, where a measured reason says the shared defaults cannot serve it.
# HalfCheetah-v5: initial action std 0.5 and 4 epochs, median 5,025 of 6 seeds at 1M
# (4,465-5,752; CleanRL 1,443; bench/published/mujoco_ppo_halfcheetah_lr4e4.json; at
# 3e-4 on another machine: 5,089, mujoco_learning_ppo_v4.json). The reason
# is the task's, not a tuning: its episode never ends when the body turns over, and with
# the shared std 1 the early noise flips it, so the policy learns to run on its back and
# stops at ~1,700 (std 1: 1,695 / 1,725 / 3,931, mujoco_learning_ppo_v2.json; greedy
# policies of such runs spend every step past a quarter turn of pitch,
# mujoco_halfcheetah_posture.json). Hopper, Walker2d and Ant end an episode when the
# body falls; Hopper needs the exploration of std 1 that flips HalfCheetah (std 0.5
# held it at 715). No one std or bonus tried serves both (docs/history.md, "One set of
# MuJoCo defaults"): std 0.7 for every level left Hopper at 2,323 (median of 3, bar
# 2,500; mujoco_ppo_std07.json), std 0.7 with entropy 0.005 left Hopper at 2,253 and
# HalfCheetah at 3,654 (mujoco_ppo_std07_ent005.json), and a KL-adapted rate at std 1
# and an early entropy bonus each turned a HalfCheetah seed over (mujoco_ppo_kl008.json,
# mujoco_ppo_std07_entdecay01.json). Std 0.5 with 10 epochs reached 5,323 and 5,394
# (one seed each) at a clip fraction up to 0.30; the entry's 4 epochs keep it at
# 0.13-0.16.
_PPO_TASK_DEFAULTS: Dict[str, Dict[str, Dict[str, Any]]] = {
    'mujoco': {'HalfCheetah-v5': dict(init_log_std=-0.69, epochs=4)},
}

# PPO's training envs (never the evaluator's). MuJoCo: each env's first episode cut at
# a random length (envs/gym_adapter.py), so the lockstepped envs of a task that never
# terminates (HalfCheetah) cover different phases of the episode in a batch
# (tests/unit/test_ppo_phases.py); `--env_config random_first_episode=False` turns it off.
_PPO_TRAIN_ENVS: Dict[str, Dict[str, Any]] = {
    'mujoco': dict(random_first_episode=True),
}


# SAC (agents/sac): MuJoCo only (continuous actions). CleanRL's settings: 256-256 MLPs,
# batch 256, one gradient step per env step (samples_per_insert 256), 5k transitions
# before learning. Where the 2 cores go (bench/learner_share.py, HalfCheetah, 2 x 4
# envs): the step alone runs ~175 times a second; in the program, with items of one
# column per field, 70/s -- sampling 256 five-column items from Reverb cost 2.6 ms of
# CPU per batch, as much as half the step. Items packed into one column (the default,
# `packed_items`): 100/s; and 4 gradient steps per sampled batch (each on its own 256
# items, one sample and one compiled call for the four): 116/s. The acting side costs
# next to nothing here (actors 0.02 cores), so niceness and eval pauses change nothing.
_SAC_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'mujoco': dict(hidden_sizes=(256, 256), batch_size=256, samples_per_insert=256.0,
                   min_replay_size=5_000, replay_size=1_000_000, sgd_steps_per_sample=4),
}


# V-trace with few envs: a learner batch needs `batch_size` whole unrolls, so with two
# envs a batch of 32 unrolls of 20 steps waits for 640 env steps, and the policy lag
# grows with it. Below this many unrolls per training env the batch shrinks to
# `_VTRACE_UNROLLS_PER_ENV * num_train_envs` (at least `_VTRACE_MIN_BATCH`). Measured
# with `run_local catch vtrace 2 1` (README, "Benchmarks"): batch 32 had not learned
# Catch in 90 s; batch 8 did.
_VTRACE_UNROLLS_PER_ENV = 4
_VTRACE_MIN_BATCH = 4


def _fit_vtrace_batch(kwargs: Dict[str, Any], num_train_envs: int,
                      overrides: Dict[str, Any], env: str) -> Dict[str, Any]:
  """A smaller learner batch when there are few training envs (see above)."""
  if 'batch_size' not in overrides:
    from seedacme.agents.vtrace.config import VTraceConfig  # pylint: disable=g-import-not-at-top
    default = kwargs.get('batch_size', VTraceConfig.batch_size)
    kwargs['batch_size'] = min(default, max(_VTRACE_MIN_BATCH,
                                            _VTRACE_UNROLLS_PER_ENV * num_train_envs))
  return kwargs


# PPO on Atari: a learner batch is one round of the training envs (each env's next
# unroll), as CleanRL's rollout of N envs x 128 steps is: with 32 envs, 8-unroll
# batches took 2.43M env steps to +18 on Pong and 32-unroll batches 1.39M
# (docs/atari.md). With fewer envs than the default batch, the batch shrinks to the
# number of envs (a batch of 32 from 2 envs would wait 16 rounds, each env's unrolls
# spanning 16 policy versions), the queue never exceeds it, and minibatches keep at
# least `_PPO_MINIBATCH_TRANSITIONS` transitions.
_PPO_MINIBATCH_TRANSITIONS = 256
_PPO_ROUND_ENVS = ('atari',)


def _fit_ppo_round(kwargs: Dict[str, Any], num_train_envs: int,
                   overrides: Dict[str, Any], env: str) -> Dict[str, Any]:
  """Atari: one batch per round of the training envs (see above); other envs as given."""
  if env not in _PPO_ROUND_ENVS:
    return kwargs
  from seedacme.agents.ppo.config import PPOConfig  # pylint: disable=g-import-not-at-top
  if 'batch_size' not in overrides:
    kwargs['batch_size'] = max(1, min(kwargs.get('batch_size', PPOConfig.batch_size),
                                      num_train_envs))
  batch = kwargs['batch_size']
  if 'queue_size' not in overrides:  # never more than a batch
    kwargs['queue_size'] = min(kwargs.get('queue_size', PPOConfig.queue_size), batch)
  if 'num_minibatches' not in overrides:
    unroll = kwargs.get('unroll_length', PPOConfig.unroll_length)
    # The most minibatches of at least 256 transitions that split the batch's items
    # evenly (items: transitions, or whole unrolls for an LSTM core).
    items = batch * (1 if kwargs.get('core', PPOConfig.core) == 'lstm' else unroll)
    count = min(items, max(1, batch * unroll // _PPO_MINIBATCH_TRANSITIONS))
    while items % count:
      count -= 1
    kwargs['num_minibatches'] = count
  return kwargs


def make_config(agent: str, env: str, num_train_envs: int | None = None, *,
                task: str | None = None, budget_env_steps: int | None = None,
                **overrides) -> Any:
  """The config dataclass of `agent` for `env`: its defaults, the registry's for `env`,
  those for `task` (the env's level, game or scenario, if given), then explicit
  overrides.

  `num_train_envs`, if given, lets the defaults fit the program's size (V-trace: a
  smaller learner batch when there are few envs; PPO on Atari: one batch per round of
  the envs); explicit overrides always win. `budget_env_steps` (the run's
  `--max_env_steps`) goes to a config that schedules by it (`with_budget`: PPO's
  learning rate annealed to 0 at the budget).
  """
  entry = _entry(agent)
  kwargs = {**entry.env_defaults.get(env, {}),
            **entry.task_defaults.get(env, {}).get(task, {}), **overrides}
  if num_train_envs is not None and entry.fit is not None:
    kwargs = entry.fit(kwargs, num_train_envs, overrides, env)
  config_class = _load(entry.config)
  config = config_class(**kwargs)
  if budget_env_steps and hasattr(config, 'with_budget'):
    config = config.with_budget(budget_env_steps)
  return config


def make_builder(agent: str, env: str, num_train_envs: int | None = None, *,
                 task: str | None = None, budget_env_steps: int | None = None,
                 **overrides) -> SeedBuilder:
  """The builder of `agent` configured for `env` (`make_config`)."""
  return _load(_entry(agent).builder)(
      make_config(agent, env, num_train_envs, task=task,
                  budget_env_steps=budget_env_steps, **overrides))


def train_env_config(agent: str, env: str) -> Dict[str, Any]:
  """Env options `agent` sets on its training envs of `env` (never the evaluator's)."""
  return dict(_entry(agent).train_env_defaults.get(env, {}))


register_agent(AgentEntry('vtrace', 'seedacme.agents.vtrace:VTraceBuilder',
                          'seedacme.agents.vtrace:VTraceConfig', _VTRACE_DEFAULTS,
                          fit=_fit_vtrace_batch))
register_agent(AgentEntry('ppo', 'seedacme.agents.ppo:PPOBuilder',
                          'seedacme.agents.ppo:PPOConfig', _PPO_DEFAULTS, fit=_fit_ppo_round,
                          train_env_defaults=_PPO_TRAIN_ENVS,
                          task_defaults=_PPO_TASK_DEFAULTS))
register_agent(AgentEntry('sac', 'seedacme.agents.sac:SACBuilder',
                          'seedacme.agents.sac:SACConfig', _SAC_DEFAULTS))
register_agent(AgentEntry('r2d2', 'seedacme.agents.r2d2:R2D2Builder',
                          'seedacme.agents.r2d2:R2D2Config', _R2D2_DEFAULTS))
