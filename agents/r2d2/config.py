"""Hyperparameters of the R2D2 agent (one dataclass; flags live in launchers)."""

import dataclasses
from typing import Tuple

from seedacme.config import check_scalar_fields


@dataclasses.dataclass
class R2D2Config:
  """R2D2 settings (paper defaults in comments; per-env defaults in agents/registry.py).

  Attributes:
    burn_in: steps replayed only to refresh the LSTM state, no gradient (paper: 40).
    trace_length: steps trained on after the burn-in (paper: 80).
    period: steps between starts of consecutive sequences of one env (paper: 40).
    n_step: n of the n-step double-Q target (paper: 5).
    discount: gamma (paper: 0.997).
    torso: what reads the observation: 'mlp', 'nature_cnn' or 'impala_resnet' (the
      last two for frames); the core after it is always an LSTM (lstm_size).
    hidden_sizes, lstm_size, dueling: the Q-network.
    learning_rate, adam_epsilon, max_gradient_norm: optimizer (Adam).
    batch_size: sequences per learner step.
    target_update_period: learner steps between target-network copies (paper: 2500).
    value_rescaling_epsilon: epsilon of h(x) = sign(x)(sqrt(|x|+1)-1) + eps x (1e-3).
    priority_eta: priority = eta max|delta| + (1 - eta) mean|delta| (0.9).
    priority_exponent: alpha of prioritized sampling (0.9).
    importance_sampling_exponent: beta of the importance weights (0.6).
    epsilon_base, epsilon_alpha: Ape-X exploration, eps_i = base^(1 + alpha i/(N-1)).
    evaluation_epsilon: epsilon of the greedy evaluator's envs.
    replay_size: sequences kept in the prioritized table.
    min_replay_size: sequences in the table before sampling starts.
    replay_checkpoint_interval_s: the replay node checkpoints the table this often and
      a restarted replay node restores the latest checkpoint (None: a restarted replay
      node starts empty and refills).
    samples_per_insert: if set, a SampleToInsertRatio limiter ties acting to learning
      (blocking inference when actors run ahead); None: only `min_replay_size`.
    reward_clip: clip rewards to [-reward_clip, reward_clip] in the loss.
    sgd_steps_per_sample: gradient steps per learner call: one sample of this many
      batches, one step on each in turn inside one compiled call, and one priority
      update for all of them (Acme's `num_sgd_steps_per_step`). Learner steps, target
      updates and budgets count gradient steps.
  """
  burn_in: int = 40
  trace_length: int = 80
  period: int = 40
  n_step: int = 5
  discount: float = 0.997
  torso: str = 'mlp'
  hidden_sizes: Tuple[int, ...] = (64,)
  lstm_size: int = 128
  dueling: bool = True
  learning_rate: float = 1e-4
  adam_epsilon: float = 1e-3
  max_gradient_norm: float | None = 40.0
  batch_size: int = 32
  target_update_period: int = 2500
  value_rescaling_epsilon: float = 1e-3
  priority_eta: float = 0.9
  priority_exponent: float = 0.9
  importance_sampling_exponent: float = 0.6
  epsilon_base: float = 0.4
  epsilon_alpha: float = 7.0
  evaluation_epsilon: float = 0.0
  replay_size: int = 100_000
  min_replay_size: int = 1_000
  samples_per_insert: float | None = None
  replay_checkpoint_interval_s: float | None = 30.0
  reward_clip: float | None = None
  sgd_steps_per_sample: int = 1
  seed: int = 0

  def __post_init__(self):
    check_scalar_fields(self)
    if self.sgd_steps_per_sample < 1:
      raise ValueError(f'R2D2Config: sgd_steps_per_sample={self.sgd_steps_per_sample} '
                       'must be >= 1')

  @property
  def sample_size(self) -> int:
    """Items per sample: a batch for each of the `sgd_steps_per_sample` steps."""
    return self.batch_size * self.sgd_steps_per_sample

  @property
  def sequence_length(self) -> int:
    """Steps per stored sequence: burn-in + trace + one bootstrap step."""
    return self.burn_in + self.trace_length + 1
