"""Agents by name, with per-environment defaults (what `run_local <env> <agent>` uses)."""

from typing import Any, Dict

from seedacme.builder import SeedBuilder

AGENT_NAMES = ('vtrace', 'r2d2')

# Per-environment overrides of the agent's config dataclass.
_VTRACE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'catch': dict(network='mlp', hidden_sizes=(64, 64), unroll_length=20, batch_size=32,
                  learning_rate=1e-3, entropy_cost=0.01),
    'cartpole': dict(network='mlp', hidden_sizes=(64, 64), unroll_length=20,
                     batch_size=32, learning_rate=1e-3, entropy_cost=0.01,
                     reward_scale=0.1),
    # Atari/DMLab: rewards clipped in the loss; envs report raw scores.
    # Feed-forward Nature CNN: what 2 CPU cores can train; SEED's own choice is
    # torso='impala_resnet' with network='lstm' (set them for accelerator runs).
    # adam_epsilon=1e-3: with Adam's default 1e-7 every parameter moves ~lr per step
    # however tiny its gradient, and on Pong the consistent early pull of the value
    # towards its mean return (~-2) drove every unit of the first conv layer below zero
    # for every frame: after 16k updates (2.5M env steps) the torso was dead, the
    # policy state-independent and returns flat at random's -20.3. The larger epsilon
    # scales small gradients down instead (SGD-like); on its own it only slowed the
    # dying, together with the Nature CNN's orthogonal init (seedacme/networks.py) Pong
    # learns (README, "Pong learns"; tests/unit/test_atari_vtrace_torso.py).
    'atari': dict(network='mlp', torso='nature_cnn', reward_clip=1.0, discount=0.99,
                  learning_rate=6e-4, adam_epsilon=1e-3, entropy_cost=0.01,
                  unroll_length=20, batch_size=32),
    'dmlab': dict(network='lstm', torso='impala_resnet', lstm_size=256, reward_clip=1.0),
    # Football (stacked SMM): SEED's feed-forward 4-stack ResNet, unroll and discount;
    # a learning rate and entropy cost for short runs (SEED's are tuned for 500M frames).
    'football': dict(network='mlp', torso='football', unroll_length=32, batch_size=16,
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
    # Paper settings except the replay size: 5k sequences of 121 frames (Reverb compresses
    # them) fit one machine; use replay_size=1_000_000 on a cluster.
    'atari': dict(torso='nature_cnn', lstm_size=512, reward_clip=1.0, replay_size=5_000,
                  min_replay_size=500),
}


# V-trace with few envs: a learner batch needs `batch_size` whole unrolls, so with two
# envs a batch of 32 unrolls of 20 steps waits for 640 env steps, and the policy lag
# grows with it. Below this many unrolls per training env the batch shrinks to
# `_VTRACE_UNROLLS_PER_ENV * num_train_envs` (at least `_VTRACE_MIN_BATCH`). Measured
# with `run_local catch vtrace 2 1` (README, "Benchmarks"): batch 32 had not learned
# Catch in 90 s; batch 8 did.
_VTRACE_UNROLLS_PER_ENV = 4
_VTRACE_MIN_BATCH = 4


def make_builder(agent: str, env: str, num_train_envs: int | None = None,
                 **overrides) -> SeedBuilder:
  """The builder of `agent` configured for `env` (plus explicit overrides).

  `num_train_envs`, if given, lets the defaults fit the program's size (V-trace: a
  smaller learner batch when there are few envs); explicit overrides always win.
  """
  if agent == 'vtrace':
    from seedacme.agents import vtrace  # pylint: disable=g-import-not-at-top
    kwargs = {**_VTRACE_DEFAULTS.get(env, {}), **overrides}
    if num_train_envs is not None and 'batch_size' not in overrides:
      default = kwargs.get('batch_size', vtrace.VTraceConfig.batch_size)
      kwargs['batch_size'] = min(default, max(_VTRACE_MIN_BATCH,
                                              _VTRACE_UNROLLS_PER_ENV * num_train_envs))
    return vtrace.VTraceBuilder(vtrace.VTraceConfig(**kwargs))
  if agent == 'r2d2':
    from seedacme.agents import r2d2  # pylint: disable=g-import-not-at-top
    kwargs = {**_R2D2_DEFAULTS.get(env, {}), **overrides}
    return r2d2.R2D2Builder(r2d2.R2D2Config(**kwargs))
  raise ValueError(f'Unknown agent {agent!r}; known: {", ".join(AGENT_NAMES)}')
