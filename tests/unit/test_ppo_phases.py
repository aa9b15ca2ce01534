"""Episode phases of lockstepped envs that never terminate (issue 36, item 3).

An actor steps its K envs in lockstep (`BatchedEnv`) and HalfCheetah never terminates,
so without help every env is at the same step of its 1,000-step episode and a learner
batch of K unrolls covers one window of the episode, K times. `random_first_episode`
(envs/gym_adapter.py) cuts each env's first episode at a random length. Measured here
on real HalfCheetah-v5 envs through the real engine: the spread of the in-episode step
indices across a batch's unrolls, without and with the option.
"""

import numpy as np
import pytest

from seedacme import envs
from seedacme.actor.engines import BatchedEnv

K, T, LIMIT = 16, 128, 1000


def batch_phases(random_first_episode: bool, num_batches: int = 3, seed: int = 0):
  """In-episode step index at the start of each of K unrolls of T steps, for
  `num_batches` consecutive batches after every env's first episode has ended.
  Returns `[num_batches, K]`."""
  factory = envs.make_factory('mujoco', level='HalfCheetah-v5',
                              random_first_episode=random_first_episode)
  engine = BatchedEnv(factory, K, seed=seed)
  rng = np.random.default_rng(seed)
  step = engine.reset()
  phase = np.zeros(K, np.int64)  # steps since the episode's FIRST step
  starts = []
  num_steps = LIMIT + T * num_batches
  for t in range(num_steps):
    if t >= LIMIT and (t - LIMIT) % T == 0:
      starts.append(phase.copy())
    step = engine.step(rng.uniform(-1, 1, (K, 6)).astype(np.float32))
    phase = np.where(step.step_type == 0, 0, phase + 1)  # FIRST restarts the count
  engine.close()
  return np.array(starts)


def spread(starts: np.ndarray) -> dict:
  """Per batch: the std of the unrolls' start phases, and the fraction of the
  episode's T-step windows the batch's unrolls start in; averaged over batches."""
  return {'phase_std': float(starts.std(axis=1).mean()),
          'windows_covered': float(np.mean([len(set(s // T)) for s in starts]) /
                                   (LIMIT // T + 1))}


@pytest.mark.timeout(120)
def test_random_first_episode_spreads_a_batch_over_the_episode():
  before = spread(batch_phases(False))
  after = spread(batch_phases(True))
  print(f'\nphases of a {K} x {T} batch, HalfCheetah-v5: without {before}, with {after}')
  assert before['phase_std'] == 0.0  # every unroll covers the same window
  assert before['windows_covered'] == pytest.approx(1 / (LIMIT // T + 1))
  assert after['phase_std'] > 200  # uniform over 1,000 steps: 289
  assert after['windows_covered'] > 0.5


def test_first_episode_is_cut_as_a_truncation_then_episodes_run_whole():
  lengths, discounts = [], []
  for seed in range(6):
    env = envs.make_factory('mujoco', level='HalfCheetah-v5', max_episode_steps=20,
                            random_first_episode=True)(seed)
    env.reset()
    episode = []
    while len(lengths) < 3 * (seed + 1):
      ts = env.step(np.zeros(6, np.float32))
      if ts.first():
        continue
      episode.append(ts)
      if ts.last():
        lengths.append(len(episode))
        discounts.append(ts.discount)
        episode = []
    env.close()
  firsts, later = lengths[::3], lengths[1::3] + lengths[2::3]
  assert all(1 <= n <= 20 for n in firsts) and len(set(firsts)) > 1  # per-seed draws
  assert later == [20] * len(later)
  assert discounts == [1.0] * len(discounts)  # cuts and time limits: truncations
  again = envs.make_factory('mujoco', level='HalfCheetah-v5', max_episode_steps=20,
                            random_first_episode=True)(0)
  again.reset()
  n = 1
  while not again.step(np.zeros(6, np.float32)).last():
    n += 1
  assert n == firsts[0]  # the cut comes from the seed


def test_off_by_default():
  env = envs.make_factory('mujoco', level='HalfCheetah-v5', max_episode_steps=7)(3)
  env.reset()
  assert [env.step(np.zeros(6, np.float32)).last() for _ in range(7)] == [False] * 6 + [True]
