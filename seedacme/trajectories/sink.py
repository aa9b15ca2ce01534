"""Where the inference server's training steps go: the trajectory sink.

`TrajectorySink` is the contract (an agent's builder makes one); `ReverbSequenceSink`
is the one both agents use: a `SequenceAssembler` (fixed-length, possibly overlapping
sequences per env) feeding a `ReverbSequenceWriter` (items into a Reverb table, with
backpressure and the reconnect protocol). For a lagged reproducible run's round
checkpoints it keeps the last L rounds' sequences it emitted (`keep_recent`), which a
resume writes again (`rewrite_recent`, `seedacme.run.resume`).
"""

import abc
import collections
from typing import Any, Deque, Dict, List

import tree

from seedacme.trajectories.assembler import SequenceAssembler
from seedacme.trajectories.writer import ReverbSequenceWriter, ToItems


def _group_size(sequences) -> int:
  """The number of sequences in an emitted group (its leaves' leading dimension)."""
  return int(tree.flatten(sequences)[0].shape[0])


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

  def keep_recent(self, sequences: int) -> None:
    """Keeps the last `sequences` emitted sequences in `state()` (a lagged reproducible
    run: the L rounds of N unrolls the learner has yet to take at a round's start)."""
    raise NotImplementedError(f'{type(self).__name__} cannot keep what it emitted')

  def rewrite_recent(self) -> int:
    """Writes again, in their order, the sequences `load_state` brought back of
    `keep_recent` (into a queue emptied for the resume); returns how many."""
    return 0


class ReverbSequenceSink(TrajectorySink):
  """`TrajectorySink` that assembles fixed-length sequences and writes them to Reverb."""

  def __init__(self, client, table: str, num_envs: int, length: int, period: int,
               to_items: ToItems,
               max_pending: int = 64):
    self.writer = ReverbSequenceWriter(client, table, to_items,
                                       max_pending=max_pending)
    self.assembler = SequenceAssembler(num_envs, length, period, self._emit)
    # `keep_recent`: the groups the assembler emitted (each [n, length, ...], its own
    # copies), the oldest dropped while the rest still hold `_keep` sequences.
    self._keep = 0
    self._recent: Deque[Any] = collections.deque()
    self._recent_count = 0
    self._to_rewrite: List[Any] = []  # `load_state`'s, for `rewrite_recent`

  def _emit(self, sequences) -> None:
    if self._keep:
      self._recent.append(sequences)
      self._recent_count += _group_size(sequences)
      while self._recent_count - _group_size(self._recent[0]) >= self._keep:
        self._recent_count -= _group_size(self._recent.popleft())
    self.writer.write(sequences)

  def keep_recent(self, sequences: int) -> None:
    self._keep = max(0, int(sequences))

  def add(self, env_ids, step) -> None:
    self.assembler.add(env_ids, step)

  def reset(self, env_ids) -> None:
    self.assembler.reset(env_ids)

  def state(self) -> Dict[str, Any]:
    state = self.assembler.state()
    if self._keep:  # exactly the last `_keep` sequences, oldest first
      over = self._recent_count - self._keep
      groups = list(self._recent)
      if over > 0:
        groups[0] = tree.map_structure(lambda x: x[over:], groups[0])
      state['recent'] = groups
    return state

  def load_state(self, state: Dict[str, Any]) -> None:
    self.assembler.load_state(state)
    self._to_rewrite = list(state.get('recent') or [])
    self._recent.clear()
    self._recent_count = 0

  def rewrite_recent(self) -> int:
    groups, self._to_rewrite = self._to_rewrite, []
    for sequences in groups:
      self._emit(sequences)
    return sum(_group_size(g) for g in groups)

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
