"""The reproducible schedule's arithmetic (`seedacme.run.schedule`, issue 63): rounds of
env calls, the learner steps each round acts after, the clock a round waits on, and
env seeds keyed by (run seed, global env id)."""

import threading
import time

import pytest

from seedacme.run import schedule
from seedacme.run.schedule import ClockClosedError, RoundClock, RoundSchedule
from seedacme.runtime.lifecycle import ShutdownError


def test_rounds_cover_every_call_once_and_end_with_their_unroll():
  s = RoundSchedule(num_envs=16, unroll_length=5, batch_size=4)
  rounds = [s.round_of(n) for n in range(5 * 7 + 1)]
  # Round 0 is calls 0..T (the reset observation and T steps), round r calls rT+1..(r+1)T.
  assert rounds == [0] * 6 + [r for r in range(1, 7) for _ in range(5)]
  for r in range(7):
    assert s.round_of(s.first_call(r)) == r and s.round_of(s.last_call(r)) == r
    assert s.first_call(r + 1) == s.last_call(r) + 1
    # Unroll r (calls rT .. (r+1)T, what the assembler emits) ends at round r's last call.
    assert s.last_call(r) == r * 5 + 5
  with pytest.raises(ValueError, match='call indices'):
    s.round_of(-1)


def test_a_round_acts_after_the_learner_steps_of_the_rounds_before_it():
  s = RoundSchedule(num_envs=16, unroll_length=20, batch_size=4)
  assert s.steps_per_round == 4
  assert [s.learner_steps_for(r) for r in range(4)] == [0, 4, 8, 12]
  lagged = RoundSchedule(16, 20, 16, lag=1)
  assert [lagged.learner_steps_for(r) for r in range(4)] == [0, 0, 1, 2]


def test_a_learner_step_comes_after_the_round_its_weights_must_not_reach():
  # 16 envs, B = 8: two steps per round. A step on round q's data (steps 2q, 2q + 1)
  # waits for round q + lag to start.
  assert [RoundSchedule(16, 20, 8).first_round_after(s) for s in range(6)] == \
      [0, 0, 1, 1, 2, 2]
  lagged = RoundSchedule(16, 20, 8, lag=1)
  assert [lagged.first_round_after(s) for s in range(6)] == [1, 1, 2, 2, 3, 3]
  # Step s + 1, taken once round first_round_after(s) started, makes weights that
  # round no longer needs (it acts after at most s steps), and every round not yet
  # started acts after at least s + 1: the learner neither waits too long nor gets ahead.
  for sched in (RoundSchedule(16, 20, 8), lagged, RoundSchedule(16, 20, 4, lag=2)):
    for s in range(12):
      started = sched.first_round_after(s)
      assert sched.learner_steps_for(started) <= s
      assert all(sched.learner_steps_for(r) >= s + 1
                 for r in range(started + 1, started + 4))


@pytest.mark.parametrize('kwargs,match', [
    (dict(num_envs=16, unroll_length=20, batch_size=32), r'batch_size=32.*= 16.*batch_size=16'),
    (dict(num_envs=12, unroll_length=20, batch_size=8), r'batch_size=6 or 12 would'),
    (dict(num_envs=0, unroll_length=20, batch_size=8), 'num_envs must be an int >= 1'),
    (dict(num_envs=8, unroll_length=True, batch_size=8), 'unroll_length must be an int'),
    (dict(num_envs=8, unroll_length=2, batch_size=8, lag=-1), 'lag must be'),
])
def test_a_schedule_it_cannot_keep_is_refused_by_name(kwargs, match):
  with pytest.raises(ValueError, match=match):
    RoundSchedule(**kwargs)


def test_the_clock_releases_a_wait_once_the_learner_gets_there():
  clock = RoundClock()
  done = []
  waiter = threading.Thread(target=lambda: done.append(clock.wait_learner_steps(3)))
  waiter.start()
  clock.note_learner_steps(2)
  time.sleep(0.2)
  assert not done  # two steps of three: still waiting
  clock.note_learner_steps(3)
  waiter.join(5)
  assert done == [True] and clock.learner_steps == 3
  assert clock.wait_learner_steps(1)  # already there: no wait
  assert clock.wait_learner_steps(4, timeout=0.1) is False
  with pytest.raises(ValueError, match='go forward'):
    clock.note_learner_steps(2)


def test_the_clock_releases_a_learner_step_once_its_round_started():
  clock = RoundClock()
  done = []
  waiter = threading.Thread(target=lambda: done.append(clock.wait_round_started(2)))
  waiter.start()
  clock.note_round_started(1)
  time.sleep(0.2)
  assert not done and clock.round_started == 1
  clock.note_round_started(2)
  waiter.join(5)
  assert done == [True]
  clock.note_round_started(0)  # rounds go forward: an older one changes nothing
  assert clock.round_started == 2
  assert clock.wait_round_started(3, timeout=0.1) is False
  clock.close()
  with pytest.raises(ClockClosedError, match='round 3 to start'):
    clock.wait_round_started(3)


@pytest.mark.parametrize('how', ['close', 'is_closed'])
def test_a_closed_clock_ends_a_wait_with_a_named_error(how):
  clock = RoundClock(learner_steps=5)
  stop = threading.Event()
  errors = []

  def wait():
    try:
      clock.wait_learner_steps(9, is_closed=stop.is_set)
    except ShutdownError as e:
      errors.append(e)
  waiter = threading.Thread(target=wait)
  waiter.start()
  time.sleep(0.2)
  assert waiter.is_alive()
  clock.close() if how == 'close' else stop.set()
  waiter.join(5)
  assert not waiter.is_alive()
  assert len(errors) == 1 and isinstance(errors[0], ClockClosedError)
  assert 'learner step 9 (at 5)' in str(errors[0])


def test_env_seeds_are_keyed_by_run_seed_and_global_env_id_only():
  block = schedule.seed_block(7)
  assert block == schedule.seed_block(7)  # a function of the seed
  assert 0 <= block < schedule.BLOCK_BOUND
  assert schedule.train_env_seed(7, 8) == block + 8
  assert schedule.eval_env_seed(7, 2) == block + schedule.EVAL_OFFSET + 2
  assert schedule.eval_env_seed(7, 2) + 2**10 < 2**31  # within every env's int32 seeds
  # Neighbouring run seeds share no env's seed (`seed + i` gave run seed 1's env 0 the
  # seed of run seed 0's env 1).
  seen = {}
  for seed in range(100):
    for e in [*(schedule.train_env_seed(seed, e) for e in range(64)),
              *(schedule.eval_env_seed(seed, j) for j in range(8))]:
      assert seen.setdefault(e, seed) == seed, f'run seeds {seen[e]} and {seed} share {e}'
  for bad in (-1, 1.5, True, '3'):
    with pytest.raises(ValueError, match='non-negative int'):
      schedule.seed_block(bad)
  with pytest.raises(ValueError, match='training env ids'):
    schedule.train_env_seed(0, schedule.EVAL_OFFSET)
