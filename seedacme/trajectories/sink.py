"""Where the inference server's training steps go: the trajectory sink.

`TrajectorySink` is the contract (an agent's builder makes one); `ReverbSequenceSink`
is the one both agents use: a `SequenceAssembler` (fixed-length, possibly overlapping
sequences per env) feeding a `ReverbSequenceWriter` (items into a Reverb table, with
backpressure and the reconnect protocol).
"""

import abc
from typing import Any, Dict

from seedacme.trajectories.assembler import SequenceAssembler
from seedacme.trajectories.writer import ReverbSequenceWriter, ToItems


class TrajectorySink(abc.ABC):
  """Receives every training step the server serves; writes trajectories to Reverb."""

  @abc.abstractmethod
  def add(self, env_ids, step: Dict[str, Any]) -> None:
    """One step for each env in `env_ids` (leaves `[B, ...]`)."""

  @abc.abstractmethod
  def reset(self, env_ids) -> None:
    """Drops the partial trajectories of these envs (their actor restarted)."""

  @abc.abstractmethod
  def stats(self) -> Dict[str, float]:
    """Counters for progress output (items written, time blocked, ...)."""

  @abc.abstractmethod
  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    """Waits until everything added so far is in Reverb; False if it did not get there."""

  def close(self) -> None:
    """Stops background work."""

  def state(self) -> Dict[str, Any] | None:
    """The partial trajectories, for a reproducible run's round checkpoint (None: this
    sink cannot save them, and a resume from it is not exact)."""
    return None

  def load_state(self, state: Dict[str, Any]) -> None:
    """Continues from `state()`."""
    raise NotImplementedError(f'{type(self).__name__} cannot load a saved state')


class ReverbSequenceSink(TrajectorySink):
  """`TrajectorySink` that assembles fixed-length sequences and writes them to Reverb."""

  def __init__(self, client, table: str, num_envs: int, length: int, period: int,
               to_items: ToItems,
               max_pending: int = 64):
    self.writer = ReverbSequenceWriter(client, table, to_items,
                                       max_pending=max_pending)
    self.assembler = SequenceAssembler(num_envs, length, period, self.writer.write)

  def add(self, env_ids, step) -> None:
    self.assembler.add(env_ids, step)

  def reset(self, env_ids) -> None:
    self.assembler.reset(env_ids)

  def state(self) -> Dict[str, Any]:
    return self.assembler.state()

  def load_state(self, state: Dict[str, Any]) -> None:
    self.assembler.load_state(state)

  def stats(self) -> Dict[str, float]:
    return {'sequences': self.assembler.sequences_emitted,
            'items_written': self.writer.items_written,
            'writer_pending': self.writer.pending,
            'writer_blocked_s': self.writer.blocked_seconds,
            'items_rewritten': self.writer.items_rewritten,
            'writer_reconnects': self.writer.reconnects}

  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    """Waits until every sequence emitted so far is in Reverb (see the writer's)."""
    return self.writer.wait_until_written(timeout_s)

  def close(self) -> None:
    self.writer.close()
