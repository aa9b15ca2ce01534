"""The learner loop's `between_steps`: a clock checkpoint sees the learner's variables
and step count from the same step, never the middle of an update."""

import threading
import time

import pytest
import tensorflow as tf

from seedacme.learner.base import Learner
from seedacme.learner.loop import LearnerLoop


class _TwoPartLearner(Learner):
  """A step that updates two variables with a pause between them (as an optimizer
  updates a network's variables one after another), after a short wait for data."""

  def __init__(self, pause_s: float = 0.005, stuck: threading.Event | None = None):
    self.a = tf.Variable(0)
    self.b = tf.Variable(0)
    self._pause_s = pause_s
    self._stuck = stuck

  def step(self):
    time.sleep(self._pause_s)  # the data wait
    self.a.assign_add(1)
    time.sleep(self._pause_s)
    if self._stuck is not None:
      self._stuck.wait()
    self.b.assign_add(1)
    return {'loss': 0.0}

  def checkpoint_state(self):
    return {'a': self.a, 'b': self.b}


@pytest.mark.timeout(60)
def test_between_steps_sees_whole_steps_and_their_count():
  learner = _TwoPartLearner()
  stop = threading.Event()
  loop = LearnerLoop(learner, stop, should_stop=lambda steps: steps >= 150)
  loop.start()
  seen, waits = [], []
  while not loop.done.is_set():
    started = time.monotonic()
    with loop.between_steps(5.0) as held:
      waits.append(time.monotonic() - started)
      assert held
      seen.append((int(learner.a.numpy()), int(learner.b.numpy()), loop.steps))
    time.sleep(0.001)
  assert loop.join(10) and loop.error is None
  torn = [s for s in seen if not s[0] == s[1] == s[2]]
  assert len(seen) > 20 and not torn, torn[:5]
  # A waiting save gets in after the step in flight (~10 ms), not after many steps.
  assert max(waits) < 1.0, max(waits)
  # Without the lock the same reads fall mid-step: the check above can fail.
  learner, stop = _TwoPartLearner(), threading.Event()
  loop = LearnerLoop(learner, stop, should_stop=lambda steps: steps >= 100)
  loop.start()
  unlocked = []
  while not loop.done.is_set():
    unlocked.append((int(learner.a.numpy()), int(learner.b.numpy()), loop.steps))
    time.sleep(0.001)
  assert loop.join(10)
  assert any(not s[0] == s[1] == s[2] for s in unlocked)


@pytest.mark.timeout(30)
def test_a_step_longer_than_the_wait_is_not_waited_for():
  stuck = threading.Event()
  learner = _TwoPartLearner(stuck=stuck)
  stop = threading.Event()
  loop = LearnerLoop(learner, stop)
  loop.start()
  while int(learner.a.numpy()) == 0:  # in its first step, stuck halfway
    time.sleep(0.001)
  started = time.monotonic()
  with loop.between_steps(0.3) as held:
    assert not held
  assert 0.25 < time.monotonic() - started < 5
  stop.set()
  stuck.set()
  assert loop.join(10) and loop.error is None
  with loop.between_steps(0.3) as held:  # the step ended: the lock is free again
    assert held
