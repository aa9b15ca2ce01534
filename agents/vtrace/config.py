"""Hyperparameters of the V-trace agent (one dataclass; flags live in launchers)."""

import dataclasses
from typing import Tuple

from absl import logging

from seedacme.config import check_scalar_fields

CORES = ('feedforward', 'lstm')
# The field's old name and values: `network='mlp'|'lstm'` (renamed because 'mlp' also
# names a torso).
_OLD_CORE_NAMES = {'mlp': 'feedforward', 'lstm': 'lstm'}


@dataclasses.dataclass
class VTraceConfig:
  """V-trace / IMPALA settings.

  Attributes:
    unroll_length: T, transitions per unroll; unrolls hold T + 1 steps (bootstrap).
    batch_size: unrolls per learner step.
    core: what follows the torso: 'feedforward' (the torso's output goes straight to
      the policy/value head) or 'lstm' (an LSTM in between).
    torso: what reads the observation: 'mlp', 'nature_cnn', 'impala_resnet' or
      'football' (the last three for frames; 'football' is SEED's torso for the
      stacked football SMM).
    hidden_sizes: MLP torso layer sizes.
    lstm_size: LSTM core size (core='lstm').
    optimizer: 'adam' (SEED's) or 'rmsprop' (IMPALA's TF1 RMSprop, agents/vtrace/optimizers.py).
    learning_rate, max_gradient_norm: both optimizers.
    adam_epsilon: Adam's epsilon (outside the square root).
    rmsprop_decay, rmsprop_momentum, rmsprop_epsilon, rmsprop_initial_ms: RMSprop; the
      defaults are IMPALA's Atari settings translated to a loss averaged over transitions.
    jit_compile: compile the learner step with XLA (bench/learner_speed.py measures it).
    discount: gamma.
    baseline_cost: weight of 0.5 * (vs - V)^2.
    entropy_cost: weight of the entropy bonus.
    clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold: V-trace truncation.
    reward_clip: clip rewards to [-reward_clip, reward_clip] in the loss (Atari: 1.0).
    reward_scale: multiply rewards by this in the loss (after clipping).
    queue_size: Reverb queue capacity in unrolls; a full queue blocks inference, which
      bounds policy lag and memory.
    squash, init_log_std: continuous actions only: the shared Normal head's squashing
      ('tanh' or 'clip') and initial log standard deviation (seedacme.distributions).
    normalize_observations, observation_clip: running mean/std of observations,
      updated by the learner, read by inference (MuJoCo's default).
  """
  unroll_length: int = 20
  batch_size: int = 32
  core: str = 'feedforward'
  torso: str = 'mlp'
  hidden_sizes: Tuple[int, ...] = (64, 64)
  lstm_size: int = 64
  optimizer: str = 'adam'
  learning_rate: float = 1e-3
  adam_epsilon: float = 1e-7
  # IMPALA's 0.99, 0, 0.01 and 1.0 for a sum over 640 transitions, per transition
  # (agents/vtrace/optimizers.py).
  rmsprop_decay: float = 0.99
  rmsprop_momentum: float = 0.0
  rmsprop_epsilon: float = 0.01 / 640 ** 2
  rmsprop_initial_ms: float = 1.0 / 640 ** 2
  jit_compile: bool = False
  max_gradient_norm: float | None = 40.0
  discount: float = 0.99
  baseline_cost: float = 0.5
  entropy_cost: float = 0.01
  clip_rho_threshold: float = 1.0
  clip_pg_rho_threshold: float = 1.0
  clip_c_threshold: float = 1.0
  reward_clip: float | None = None
  reward_scale: float = 1.0
  queue_size: int = 256
  squash: str = 'tanh'
  init_log_std: float = -0.5
  normalize_observations: bool = False
  observation_clip: float = 10.0
  seed: int = 0
  # Deprecated spelling of `core` ('mlp' -> 'feedforward'); not a field (not stored).
  network: dataclasses.InitVar[str | None] = None

  def __post_init__(self, network: str | None) -> None:
    check_scalar_fields(self)
    if network is not None:
      if network not in _OLD_CORE_NAMES:
        raise ValueError(f'network={network!r}: the field is now core, one of {CORES}')
      self.core = _OLD_CORE_NAMES[network]
      logging.warning("VTraceConfig: network=%r is deprecated; use core=%r (network "
                      "was renamed core: 'mlp' is a torso)", network, self.core)
    if self.core not in CORES:
      raise ValueError(f'core={self.core!r}: choose one of {CORES} (the torso is '
                       'set by torso=)')
