"""The inference server's round gate: what makes serving a function of the seed (issue 63).

A reproducible run (`ProgramConfig.reproducible`) serves training envs in rounds
(`seedacme.run.schedule`). The parts:

* `RoundBatcher` (`seedacme.serving.batcher`) forms each training batch from exactly
  one request of every training env; the server puts its rows in env-id order before
  the policy call and the trajectory sink, and the actions back in the callers' order
  for the replies. So every training call of the policy is the same [N] batch in the
  same order on any split of the envs, and the policy's action-noise generator is
  drawn from identically (evaluation batches run alone and leave the generator as they
  found it: `seedacme.serving.tf_policy`).
* `RoundGate` (here) counts the calls served (every env has had the same number) and,
  before a round's first call, waits for the learner steps that round acts after
  (`RoundSchedule.learner_steps_for`, `RoundClock`) -- the version barrier -- then,
  with a lagged schedule, makes inference's copy of the policy those weights
  (`sync_weights`), tells the reproducible evaluator the round started
  (`EvalPasses.round_started`: it keeps a copy of the round's weights for the passes
  that start in it, `seedacme.serving.evaluation`), runs the round hook (the central
  node's: the round's record, and whether the run ends there) and notes the round's
  start on the clock. The learner's next step waits for that note
  (`RoundSchedule.first_round_after`), so at the barrier the learner stands exactly at
  S(r): its weights and metrics are the round's. Lag 0: acting and learning alternate
  and inference reads the learner's variables (they cannot change during a round).
  Lag >= 1: the learner trains on round r - L's data while round r acts on its copy.
* What it cannot replay exactly it records: the first round whose record may differ
  from the uninterrupted run's (`exact_until_round`; an actor restarted, a request
  served twice, a resume from a wall-clock checkpoint) goes into the summary.

Numpy and the standard library only: the server imports it.
"""

import threading
import time
from typing import Any, Callable

from absl import logging

from seedacme.run.schedule import RoundClock, RoundSchedule

# The round hook: given the round about to start, a stop reason (the run ends before
# that round is served) or None.
RoundHook = Callable[[int], Any]


class RoundGate:
  """Call counting, the version barrier and the round hook of a reproducible server."""

  def __init__(self, schedule: RoundSchedule, clock: RoundClock | None = None,
               on_round: RoundHook | None = None,
               is_closed: Callable[[], bool] = lambda: False,
               max_learner_steps: int | None = None, learner_steps_at_start: int = 0,
               sync_weights: Callable[[], None] | None = None):
    """`clock`: the learner's progress (None: acting only, no barrier); `is_closed`:
    polled while waiting at the barrier (the run is stopping); `max_learner_steps`: the
    learner stops there, so no barrier waits for more; `learner_steps_at_start`: the
    steps a resumed learner had (the rounds of this process count from there);
    `sync_weights`: copies the learner's policy variables to inference's, after the
    barrier (a lagged schedule: the learner trains while a round acts)."""
    self.schedule = schedule
    self.clock = clock
    self._sync_weights = sync_weights
    self._on_round = on_round
    self._is_closed = is_closed
    self._max_learner_steps = max_learner_steps
    self._steps_at_start = int(learner_steps_at_start)
    self._lock = threading.Lock()
    self.calls = 0  # calls served to every training env (each batch is one of each)
    self.round = -1  # the round being served (-1: none yet)
    self.stop: Any = None  # the hook's stop reason, once it gave one
    self.exact_until_round: int | None = None  # None: exact so far
    self.learner_wait_s = 0.0  # spent at the barrier, acting idle (the schedule's cost)
    self.not_exact_because: str | None = None
    # A reproducible evaluator's passes (`seedacme.serving.evaluation.EvalPasses`), set
    # by the central node: told each round's start, after the barrier (None: none).
    self.evaluation: Any = None

  def resume_at(self, learner_steps: int) -> None:
    """A resumed learner had `learner_steps`: this process's rounds count from there."""
    self._steps_at_start = int(learner_steps)

  def continue_at(self, round_index: int) -> None:
    """An exact resume (a round checkpoint of round `round_index`): the next batch is
    that round's first call, and rounds count as in the run that saved it."""
    self._steps_at_start = 0
    self.calls = self.schedule.first_call(round_index)
    self.round = round_index - 1

  @property
  def num_envs(self) -> int:
    return self.schedule.num_envs

  def learner_steps_before(self, round_index: int) -> int:
    """The learner steps round `round_index` waits for (at most the learner budget)."""
    steps = self._steps_at_start + self.schedule.learner_steps_for(round_index)
    if self._max_learner_steps is not None:
      steps = min(steps, self._max_learner_steps)
    return steps

  def learner_may_step(self, learner_steps: int, timeout: float | None = None) -> bool:
    """Whether the learner, at `learner_steps`, may take its next step: once the round
    it must come after has started (waits up to `timeout` seconds; False: not yet).
    Raises `ClockClosedError` if the run stops meanwhile."""
    if self.clock is None:
      return True
    needed = self.schedule.first_round_after(max(0, learner_steps - self._steps_at_start))
    return self.clock.wait_round_started(needed, self._is_closed, timeout)

  def before_call(self) -> bool:
    """Before the batch that serves every env its call `calls` (on the batch's leader
    thread). At a round's first call: waits for the learner steps the round acts after
    (raises `ClockClosedError` if the run stops meanwhile), then runs the round hook.
    False: the hook ended the run before this round (`stop`); nothing is served."""
    if self.stop is not None:
      return False
    n = self.calls
    r = self.schedule.round_of(n)
    if n != self.schedule.first_call(r):
      return True
    if self.clock is not None:
      started = time.monotonic()
      try:
        self.clock.wait_learner_steps(self.learner_steps_before(r), self._is_closed)
      finally:
        self.learner_wait_s += time.monotonic() - started
    self.round = r
    if self._sync_weights is not None:  # the learner stands at S(r): this round's weights
      self._sync_weights()
    if self.evaluation is not None:  # the evaluator's copy of this round's weights
      self.evaluation.round_started(r, self.learner_steps_before(r))
    if self._on_round is not None:
      stop = self._on_round(r)
      if stop is not None:
        self.stop = stop
        if self.evaluation is not None:
          self.evaluation.run_ended(r, self.learner_steps_before(r))
        return False
    if self.clock is not None:  # the learner may now step past S(r)
      self.clock.note_round_started(r)
    return True

  def after_call(self) -> None:
    """The batch was served: every env has had one more call."""
    self.calls += 1

  def not_exact(self, why: str, round_index: int | None = None) -> None:
    """From round `round_index` on (default: the one being served) the run may differ
    from the one its seed names; the first such event is kept, and logged."""
    with self._lock:
      if self.exact_until_round is not None:
        return
      self.exact_until_round = max(self.round if round_index is None else round_index, 0)
      self.not_exact_because = why
    logging.warning('Reproducible run: not exact after round %d: %s',
                    self.exact_until_round, why)
