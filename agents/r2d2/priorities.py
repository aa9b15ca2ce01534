"""Initial priorities of new sequences, computed by the inference server in numpy.

The server already has the online Q-values it acted with (stored per step), so it can
estimate each new sequence's TD errors the way R2D2's actors do -- without TensorFlow
on the hot path and without another network call. Same targets as `losses.r2d2_loss`,
with the behaviour Q-values standing in for both networks.
"""

import numpy as np

from seedacme.types import LAST


def value_rescale(x, eps=1e-3):
  return np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x, eps=1e-3):
  return np.sign(x) * (np.square((np.sqrt(1.0 + 4.0 * eps * (np.abs(x) + 1.0 + eps)) - 1.0)
                                 / (2.0 * eps)) - 1.0)


def n_step_returns(rewards, discounts, mask, values, n):
  """numpy twin of `losses.n_step_returns` (time-major, `values` has T + 1 rows)."""
  t_len = rewards.shape[0]
  pad = np.zeros((n,) + rewards.shape[1:], rewards.dtype)
  r = np.concatenate([rewards, pad])
  g = np.concatenate([discounts, pad])
  m = np.concatenate([mask.astype(rewards.dtype), pad])
  v = np.concatenate([values, np.repeat(values[-1:], n, axis=0)])
  returns = np.zeros_like(rewards)
  coef = np.ones_like(rewards)
  active = np.ones_like(rewards)
  for k in range(n):
    m_k, r_k, g_k, v_k = m[k:k + t_len], r[k:k + t_len], g[k:k + t_len], v[k:k + t_len]
    returns += active * (1.0 - m_k) * coef * v_k
    active = active * m_k
    returns += active * coef * r_k
    coef = coef * np.where(active > 0, g_k, 1.0)
  return returns + active * coef * v[n:n + t_len]


def sequence_priorities(q, actions, rewards, discounts, step_types, *, burn_in, n_step,
                        gamma, eta, rescale_eps, reward_clip=None):
  """Priorities of N sequences (batch-major inputs `[N, L, ...]` as assembled).

  Only the trace part (after `burn_in`) counts, as in the learner.
  """
  q = np.swapaxes(q[:, burn_in:], 0, 1).astype(np.float64)  # [T+1, N, A]
  actions = np.swapaxes(actions[:, burn_in:], 0, 1)
  step_types = np.swapaxes(step_types[:, burn_in:], 0, 1)
  rewards = np.swapaxes(rewards[:, burn_in + 1:], 0, 1).astype(np.float64)
  if reward_clip is not None:
    rewards = np.clip(rewards, -reward_clip, reward_clip)
  discounts = gamma * np.swapaxes(discounts[:, burn_in + 1:], 0, 1).astype(np.float64)
  mask = (step_types[:-1] != LAST).astype(np.float64)
  bootstrap = inverse_value_rescale(q.max(axis=-1), rescale_eps)
  returns = n_step_returns(rewards, discounts, mask, bootstrap, n_step)
  q_taken = np.take_along_axis(q[:-1], actions[:-1, :, None].astype(np.int64), -1)[..., 0]
  abs_td = np.abs(mask * (value_rescale(returns, rescale_eps) - q_taken))
  mean = abs_td.sum(0) / np.maximum(mask.sum(0), 1.0)
  return eta * abs_td.max(0) + (1.0 - eta) * mean
