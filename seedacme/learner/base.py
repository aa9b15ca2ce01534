"""The learner contract: the training side of the central node, as an agent gives it.

`LearnerLoop` (`seedacme.learner.loop`) steps it on a background thread; the
checkpointer saves its `checkpoint_state()`.
"""

import abc
from typing import Any, Dict


class DivergedError(FloatingPointError):
  """The loss or its gradients became NaN or infinite: the run cannot go on (a restart
  from the same checkpoint would diverge again), and no later checkpoint is saved, so
  the last good one stays. Learners raise it (or return a non-finite metric, which
  `LearnerLoop` turns into it)."""


class Learner(abc.ABC):
  """The training side of the central node.

  `steps_per_call`: gradient steps one `step()` takes (a learner that fuses several
  into one compiled call says so); `LearnerLoop` counts learner steps by it.
  """

  steps_per_call: int = 1

  @abc.abstractmethod
  def step(self) -> Dict[str, float] | None:
    """`steps_per_call` SGD steps; their metrics, or None if no data arrived in time."""

  @abc.abstractmethod
  def checkpoint_state(self) -> Dict[str, Any]:
    """Everything trained that a restart must not lose: networks, optimizer, counters
    (TF trackables; saved with `tf.train.Checkpoint`)."""

  def resume_state(self) -> Dict[str, Any]:
    """What the learner keeps outside its TF variables that later steps depend on
    (pickled into a reproducible run's round checkpoint: `seedacme.run.resume`);
    {} when nothing."""
    return {}

  def load_resume_state(self, state: Dict[str, Any]) -> None:
    """Continues from `resume_state()`."""
    del state

  def warm_up(self) -> bool:
    """Builds the SGD step's graph before the first batch arrives; returns whether the
    step is traced now (False: this learner has nothing to trace ahead).

    Tracing a learner step takes seconds; done while actors start and fill the replay,
    it is off the path to the first learner step.
    """
    return False

  def close(self) -> None:
    """Releases datasets and threads."""


class BatchLearner(Learner):
  """A learner that trains on one batch at a time from `self._batches`
  (`seedacme.trajectories.datasets.ReverbBatches`, or None when fed by hand)."""

  _batches: Any = None

  @abc.abstractmethod
  def train_on(self, batch) -> Dict[str, float]:
    """One learner step on a given batch (used by `step` and by tests)."""

  def step(self) -> Dict[str, float] | None:
    batch = self._batches.next()
    if batch is None:
      return None
    return self.train_on(batch)

  def close(self) -> None:
    if self._batches is not None:
      self._batches.close()
