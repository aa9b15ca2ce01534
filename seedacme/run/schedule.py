"""The reproducible schedule's arithmetic: env seeds by global env id, rounds of env
calls, and the learner steps each round acts after (issue 63).

Seeds. Env e's seed is a function of the run seed and e only: `seed_block(seed) + e`
for training env e, `seed_block(seed) + EVAL_OFFSET + j` for evaluator env j. Actors
get `seed_block(seed) + first_env_id` and their engines add the slot, so env 8 has one
seed whether it is slot 0 of actor 1 in 2 x 8 or slot 0 of actor 2 in 4 x 4. The block
comes from numpy's `SeedSequence` (a hash), so neighbouring run seeds do not share
envs' seeds as `seed + i` did (run seed 1's env 0 was run seed 0's env 1).

Rounds. N training envs, unroll length T, learner batch B (B | N). The n-th request of
an env is its call n (call 0: the reset observation). Round 0 is calls 0..T; round
r >= 1 is calls rT+1 .. (r+1)T. So every env's unroll r (calls rT .. (r+1)T, the T + 1
steps the assembler emits) is complete at the last call of round r. With lag 0, round r
acts with the weights after learner step S(r) = r * N / B: the learner's output for the
data of rounds 0..r-1 (N unrolls each, N / B batches). `lag` L acts one version older
per unit: S(r) = max(0, r - L) * N / B.

Lag 0: acting and learning take turns (round r waits for the learner to train on round
r - 1; the learner then waits for round r's data). Lag 1 (Cleanba's schedule): round r
acts while the learner trains on round r - 1, and round r + 1 waits for that. Both are
exact; so that the weights a round acts with are S(r)'s and no later, the learner's
step on round q's data waits until round q + L has started (`first_round_after`, and
the clock's `wait_round_started`): it may overlap round q + L, never get ahead of it.

`RoundClock` is where the learner's progress meets acting: the learner loop notes each
step and the round gate each round's start; the first call of a round waits for its
S(r), and a learner step for the round it must come after, interruptibly (a closed run
is `ClockClosedError`, a `ShutdownError`).

Numpy and the standard library only: the launcher (seeds) and the server (rounds)
import it.
"""

import threading
import time
from typing import Callable

import numpy as np

from seedacme.runtime.lifecycle import ShutdownError

# Seed blocks lie in [0, BLOCK_BOUND); a block holds training envs at 0 .. 2**20 - 1,
# evaluator envs from EVAL_OFFSET on, and stays below 2**31 (gymnasium, ALE and bsuite
# all take int32 seeds).
EVAL_OFFSET = 2**20
BLOCK_BOUND = 2**31 - 2**21
_SEED_DOMAIN = 63  # tells this use of the run seed apart from any other SeedSequence's


def seed_block(seed: int) -> int:
  """The first env seed of run seed `seed` (a non-negative int): a hash of it."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'a run seed is a non-negative int, got {seed!r}')
  state = np.random.SeedSequence([int(seed), _SEED_DOMAIN]).generate_state(1, np.uint64)[0]
  return int(state % np.uint64(BLOCK_BOUND))


def train_env_seed(seed: int, env_id: int) -> int:
  """The seed of training env `env_id` (global id) of run seed `seed`; an actor whose
  first env is `env_id` gets this, and its engine adds the slot."""
  if not 0 <= env_id < EVAL_OFFSET:
    raise ValueError(f'training env ids are 0..{EVAL_OFFSET - 1} here, got {env_id}')
  return seed_block(seed) + env_id


def eval_env_seed(seed: int, eval_index: int) -> int:
  """The seed of the evaluator's env `eval_index` (0-based among its envs): a range
  apart from every training env's."""
  if not 0 <= eval_index < EVAL_OFFSET:
    raise ValueError(f'evaluator env indices are 0..{EVAL_OFFSET - 1}, got {eval_index}')
  return seed_block(seed) + EVAL_OFFSET + eval_index


class RoundSchedule:
  """Rounds of env calls and the learner step each round acts after (module docstring)."""

  def __init__(self, num_envs: int, unroll_length: int, batch_size: int, lag: int = 0):
    for name, value in (('num_envs', num_envs), ('unroll_length', unroll_length),
                        ('batch_size', batch_size)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'RoundSchedule: {name} must be an int >= 1, got {value!r}')
    if isinstance(lag, bool) or not isinstance(lag, (int, np.integer)) or lag < 0:
      raise ValueError(f'RoundSchedule: lag must be an int >= 0, got {lag!r}')
    if num_envs % batch_size:
      fits = max(b for b in range(1, min(batch_size, num_envs) + 1) if num_envs % b == 0)
      raise ValueError(
          f'the learner batch (batch_size={batch_size} unrolls) must divide the '
          f'training envs (num_actors x envs_per_actor = {num_envs}): a round gives one '
          f'unroll per env, and the learner takes whole rounds (batch_size={fits} or '
          f'{num_envs} would: --agent_config batch_size={fits})')
    self.num_envs, self.unroll_length = int(num_envs), int(unroll_length)
    self.batch_size, self.lag = int(batch_size), int(lag)
    self.steps_per_round = self.num_envs // self.batch_size

  def __repr__(self) -> str:
    return (f'RoundSchedule(num_envs={self.num_envs}, unroll_length={self.unroll_length}, '
            f'batch_size={self.batch_size}, lag={self.lag})')

  def round_of(self, call_index: int) -> int:
    """The round of an env's call `call_index` (0: its reset observation)."""
    if call_index < 0:
      raise ValueError(f'call indices are >= 0, got {call_index}')
    return 0 if call_index == 0 else (int(call_index) - 1) // self.unroll_length

  def first_call(self, round_index: int) -> int:
    """An env's first call of round `round_index`."""
    if round_index < 0:
      raise ValueError(f'rounds are >= 0, got {round_index}')
    return 0 if round_index == 0 else round_index * self.unroll_length + 1

  def last_call(self, round_index: int) -> int:
    """An env's last call of round `round_index`: the one that completes its unroll
    `round_index`."""
    if round_index < 0:
      raise ValueError(f'rounds are >= 0, got {round_index}')
    return (round_index + 1) * self.unroll_length

  def learner_steps_for(self, round_index: int) -> int:
    """S(r): the learner steps done before round `round_index` acts."""
    if round_index < 0:
      raise ValueError(f'rounds are >= 0, got {round_index}')
    return max(0, round_index - self.lag) * self.steps_per_round

  def first_round_after(self, learner_steps: int) -> int:
    """The round that must have started before the learner's step `learner_steps` + 1
    (it trains on round learner_steps // (N / B)'s data): that round + lag. Stepping
    sooner would change the weights a started-later round acts with."""
    if learner_steps < 0:
      raise ValueError(f'learner steps are >= 0, got {learner_steps}')
    return int(learner_steps) // self.steps_per_round + self.lag


class ClockClosedError(ShutdownError):
  """A wait for learner steps ended because the run is stopping."""


class RoundClock:
  """The learner steps done so far, and waits for a number of them.

  The learner loop calls `note_learner_steps` after each step (and once with the
  restored count); a round's first call waits in `wait_learner_steps`. The round gate
  calls `note_round_started` once a round's weights are fixed; a learner step waits in
  `wait_round_started` for the round it must come after (`first_round_after`). `close`
  (or the caller's `is_closed`, polled) ends every wait with `ClockClosedError`.
  """

  POLL_S = 0.05  # how often a wait checks `is_closed` (which cannot notify)

  def __init__(self, learner_steps: int = 0):
    self._condition = threading.Condition()
    self._steps = int(learner_steps)
    self._round = -1  # the last round started (-1: none yet)
    self._closed = False

  @property
  def learner_steps(self) -> int:
    with self._condition:
      return self._steps

  @property
  def round_started(self) -> int:
    with self._condition:
      return self._round

  def note_round_started(self, round_index: int) -> None:
    """Round `round_index` has started: its weights are fixed (rounds go forward)."""
    with self._condition:
      self._round = max(self._round, int(round_index))
      self._condition.notify_all()

  def note_learner_steps(self, steps: int) -> None:
    """The learner has done `steps` steps in all (never fewer than noted before)."""
    with self._condition:
      if steps < self._steps:
        raise ValueError(f'learner steps go forward: noted {self._steps}, now {steps}')
      self._steps = int(steps)
      self._condition.notify_all()

  def close(self) -> None:
    """Ends every wait, now and later, with `ClockClosedError`."""
    with self._condition:
      self._closed = True
      self._condition.notify_all()

  def wait_learner_steps(self, steps: int,
                         is_closed: Callable[[], bool] = lambda: False,
                         timeout: float | None = None) -> bool:
    """Waits until the learner has done `steps` steps: True, or False after `timeout`
    seconds (None: no limit). Raises `ClockClosedError` once the clock is closed or
    `is_closed()` is true (checked every `POLL_S`)."""
    return self._wait(lambda: self._steps >= steps, is_closed, timeout,
                      lambda: f'learner step {steps} (at {self._steps})')

  def wait_round_started(self, round_index: int,
                         is_closed: Callable[[], bool] = lambda: False,
                         timeout: float | None = None) -> bool:
    """Waits until round `round_index` has started: True, or False after `timeout`
    seconds; `ClockClosedError` as `wait_learner_steps`."""
    return self._wait(lambda: self._round >= round_index, is_closed, timeout,
                      lambda: f'round {round_index} to start (at {self._round})')

  def _wait(self, done: Callable[[], bool], is_closed: Callable[[], bool],
            timeout: float | None, what: Callable[[], str]) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._condition:
      while True:
        if self._closed or is_closed():
          raise ClockClosedError(f'stopped waiting for {what()}: the run is stopping')
        if done():
          return True
        wait = self.POLL_S
        if deadline is not None:
          left = deadline - time.monotonic()
          if left <= 0:
            return False
          wait = min(wait, left)
        self._condition.wait(wait)
