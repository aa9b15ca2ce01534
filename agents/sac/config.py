"""Hyperparameters of the SAC agent (one dataclass; flags live in launchers).

Defaults are CleanRL's / SEED RL's SAC for MuJoCo where they apply: 256-256 ReLU MLPs,
Adam 3e-4 (actor and critics; temperature 3e-4), batch 256, gamma 0.99, Polyak 0.005,
target entropy -|A|, 5k random-free warm-up transitions before learning. Replay is
uniform; `samples_per_insert` ties acting to learning through Reverb's
`SampleToInsertRatio` limiter (CleanRL's one gradient step of 256 per env step is 256).
"""

import dataclasses
from typing import Tuple

from seedacme.config import check_scalar_fields


@dataclasses.dataclass
class SACConfig:
  """SAC settings.

  Attributes:
    hidden_sizes: actor and critic MLPs (ReLU).
    batch_size: transitions per gradient step.
    n_step: transitions per replay item's return (1: one-step TD); items hold n + 1
      steps.
    discount: gamma.
    tau: Polyak averaging of the target critics per step.
    actor_learning_rate, critic_learning_rate, alpha_learning_rate: Adam's.
    initial_alpha: the entropy temperature's start; learned toward `target_entropy`
      (None: -|A|).
    replay_size: transitions kept (FIFO); min_replay_size: before sampling starts.
    samples_per_insert: SampleToInsertRatio limiter (None: only `min_replay_size`).
    observation_normalization: running mean/std of observations (off by default:
      replayed observations are normalized with today's statistics).
    reward_scale: multiply rewards by this in the loss.
    max_gradient_norm: global-norm clipping per loss (None: off).
    replay_checkpoint_interval_s: the replay node checkpoints the table this often.
    sgd_steps_per_sample: gradient steps per learner call: one sample of this many
      batches, then one gradient step on each in turn inside one compiled call (Acme's
      `num_sgd_steps_per_step`). Every step still sees its own `batch_size` items; what
      is saved is the per-call overhead (Python, the sample round trip, the metrics'
      copy to the host). Learner steps, targets and budgets count gradient steps.
    packed_items: store each replay item as one float32 column
      (`seedacme.trajectories.packing`; observations rounded to float32): sampling a
      batch costs less than half the CPU of one column per field.
  """
  hidden_sizes: Tuple[int, ...] = (256, 256)
  batch_size: int = 256
  n_step: int = 1
  discount: float = 0.99
  tau: float = 0.005
  actor_learning_rate: float = 3e-4
  critic_learning_rate: float = 3e-4
  alpha_learning_rate: float = 3e-4
  initial_alpha: float = 1.0
  target_entropy: float | None = None
  replay_size: int = 1_000_000
  min_replay_size: int = 5_000
  samples_per_insert: float | None = 256.0
  observation_normalization: bool = False
  reward_scale: float = 1.0
  max_gradient_norm: float | None = None
  replay_checkpoint_interval_s: float | None = 60.0
  sgd_steps_per_sample: int = 1
  packed_items: bool = True
  seed: int = 0

  def __post_init__(self):
    check_scalar_fields(self)
    if self.n_step < 1:
      raise ValueError(f'SACConfig: n_step={self.n_step} must be >= 1')
    if self.sgd_steps_per_sample < 1:
      raise ValueError(f'SACConfig: sgd_steps_per_sample={self.sgd_steps_per_sample} '
                       'must be >= 1')
    if not 0.0 < self.tau <= 1.0:
      raise ValueError(f'SACConfig: tau={self.tau} must be in (0, 1]')
    if self.min_replay_size < self.batch_size:
      raise ValueError(f'SACConfig: min_replay_size={self.min_replay_size} must hold a '
                       f'batch of {self.batch_size}')

  @property
  def sample_size(self) -> int:
    """Items per sample: a batch for each of the `sgd_steps_per_sample` steps."""
    return self.batch_size * self.sgd_steps_per_sample
