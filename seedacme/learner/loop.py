"""The learner loop: the agent's `Learner` stepped on a background thread of the central node.

Separate from the node's main thread so that progress, checkpoints and budget checks run
on their own clock (a slow learner step does not delay them) and the main thread stays
free to run Launchpad's SIGTERM handler while the learner blocks in Reverb. The loop only
counts steps and keeps the last metrics; whoever owns it decides when to stop
(`should_stop(steps)`, asked before every step: the central node's budgets and finish).
Its first step traced, it marks the central node's `learner_traced` start-up phase
(`seedacme.runtime.startup`). In a reproducible run it notes every step on the round
clock (`seedacme.run.schedule.RoundClock`), after `after_step` (the inference copy is
then current): a round's first inference call waits there for the steps it acts after.
And before every step it asks `may_step` (the round gate's `learner_may_step`): a step
on round q's data waits until round q + lag has started, so the learner never changes
weights a round has yet to act with.

A step and its count are taken under `state_lock`, and a clock checkpoint is written
between steps (`between_steps`): a save on the node's main thread while the learner
thread applied an update could hold part of that step under the counters of the step
before, or walk the optimizer while its first update creates Adam's slots (a KeyError
seen once on such a save). A step holds the lock for at most its data wait (the
sampler's timeout) and its update (the warm-up's tracing too); a save waits for that,
never longer than it is told, and the loop takes no step while a save waits.
"""

import contextlib

import math
import threading
import time
from typing import Callable, Dict, Iterator

from absl import logging

from seedacme.learner.base import DivergedError, Learner
from seedacme.run.schedule import RoundClock
from seedacme.runtime import startup


class LearnerLoop:
  """Steps `learner` until `stop` is set or `should_stop(steps)` says so."""

  WAIT_S = 0.1  # a wait in `may_step` before the stop is checked again

  def __init__(self, learner: Learner, stop: threading.Event, step_delay_s: float = 0.0,
               should_stop: Callable[[int], bool] = lambda steps: False, steps: int = 0,
               after_step: Callable[[], None] | None = None,
               clock: RoundClock | None = None,
               may_step: Callable[[int, float], bool] | None = None):
    """`steps`: the step count to continue from (a resumed run); `after_step`: called
    after every learner step (the inference copy of the variables, when separate);
    `clock`: told the step count after each step (reproducible runs); `may_step(steps,
    timeout_s)`: whether the next step may be taken, waiting up to `timeout_s`
    (reproducible runs; the loop asks again, checking its stop, until it may)."""
    self.learner = learner
    self._stop = stop
    self._step_delay_s = step_delay_s
    self._should_stop = should_stop
    self.steps = steps
    self._after_step = after_step
    self._clock = clock
    self._may_step = may_step
    self.metrics: Dict[str, float] = {}
    self.error: BaseException | None = None
    self.done = threading.Event()
    self.state_lock = threading.Lock()  # held by a step and its count (`between_steps`)
    # Set while `between_steps` waits or holds: the loop does not take the lock again
    # meanwhile (a thread releasing a Lock and taking it back at once can starve a waiter).
    self._wanted = threading.Event()
    self._thread = threading.Thread(target=self._run, name='learner', daemon=True)

  def start(self) -> None:
    self._thread.start()

  def _run(self) -> None:
    try:
      started = time.monotonic()
      with self.state_lock:  # tracing the step may create the optimizer's slots
        self.learner.warm_up()  # while actors start and the replay fills
      logging.info('Learner step traced in %.1fs', time.monotonic() - started)
      startup.mark('learner', 'learner_traced')
      while not self._stop.is_set() and not self._should_stop(self.steps):
        if self._may_step is not None and not self._may_step(self.steps, self.WAIT_S):
          continue
        while self._wanted.is_set() and not self._stop.is_set():
          time.sleep(0.001)
        with self.state_lock:
          metrics = self.learner.step()
          if metrics is not None:
            bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
            if bad:
              raise DivergedError(f'non-finite learner metrics at step {self.steps + 1}: '
                                  + ', '.join(f'{k}={metrics[k]}' for k in bad))
            self.steps += self.learner.steps_per_call
            self.metrics = metrics
        if metrics is not None:
          if self._after_step is not None:
            self._after_step()
          if self._clock is not None:
            self._clock.note_learner_steps(self.steps)
          if self._step_delay_s:
            self._stop.wait(self._step_delay_s)
    except BaseException as e:  # pylint: disable=broad-except
      logging.exception('Learner failed')
      self.error = e
    finally:
      self.done.set()

  @contextlib.contextmanager
  def between_steps(self, timeout_s: float) -> Iterator[bool]:
    """Holds the learner between two steps (its variables and `steps` agree) for the
    block; yields whether it got there within `timeout_s` (False: the block runs
    without it, and should not save)."""
    self._wanted.set()
    try:
      held = self.state_lock.acquire(timeout=timeout_s)
      try:
        yield held
      finally:
        if held:
          self.state_lock.release()
    finally:
      self._wanted.clear()

  def join(self, timeout_s: float) -> bool:
    """Waits for the thread to end; True when it did (or never started)."""
    if self._thread.ident is not None:
      self._thread.join(timeout_s)
    return not self._thread.is_alive()
