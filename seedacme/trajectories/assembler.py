"""Trajectories assembled on the server: per-env buffers that emit sequences.

The inference server sees every env's steps in order. `SequenceAssembler` keeps a
per-env buffer (keyed by global env id) and emits fixed-length sequences:

* V-trace unrolls: `length = T + 1`, `period = T` -- consecutive unrolls share one step,
  the bootstrap step of one is the first step of the next.
* R2D2 sequences: `length = burn_in + trace`, `period` < length -- overlapping windows.

Sequences run straight across episode boundaries (LAST followed by FIRST); the loss
masks the step that crosses. `reset(env_ids)` drops a partial buffer, which the server
does when an actor restarts (new run id).
"""

from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import tree

from seedacme.types import Nest


class SequenceAssembler:
  """Per-env step buffers that emit fixed-length, possibly overlapping sequences."""

  def __init__(self, num_envs: int, length: int, period: int,
               on_sequences: Callable[[Nest], None]):
    """Creates the assembler.

    Args:
      num_envs: number of global env ids.
      length: steps per emitted sequence.
      period: steps between the starts of consecutive sequences of one env
        (1 <= period <= length).
      on_sequences: called with a nest of arrays `[N, length, ...]` (N completed
        sequences, leading dims env then time) whenever sequences complete.
    """
    if not 1 <= period <= length:
      raise ValueError(f'need 1 <= period <= length, got period={period}, length={length}')
    self._num_envs = num_envs
    self._length = length
    self._period = period
    self._on_sequences = on_sequences
    self._structure = None
    self._buffers: List[np.ndarray] = []
    self._count = np.zeros(num_envs, np.int64)
    self.sequences_emitted = 0

  def _allocate(self, step: Nest) -> None:
    self._structure = step
    self._buffers = [
        np.zeros((self._num_envs, self._length) + leaf.shape[1:], leaf.dtype)
        for leaf in tree.flatten(step)]

  def state(self) -> Dict[str, Any]:
    """The partial sequences (each env's steps not yet emitted; at a reproducible
    round's start, the step the next unroll starts with) and the counters: what
    `load_state` continues from."""
    keep = int(self._count.max()) if self._count.size else 0
    steps = None
    if self._structure is not None:
      steps = tree.unflatten_as(self._structure,
                                [buf[:, :keep].copy() for buf in self._buffers])
    return {'count': self._count.copy(), 'steps': steps,
            'sequences_emitted': self.sequences_emitted}

  def load_state(self, state: Dict[str, Any]) -> None:
    """Continues from `state()` of an assembler of the same shape."""
    count = np.asarray(state['count'], np.int64)
    if count.shape != self._count.shape or (count > self._length).any():
      raise ValueError(f'assembler state for {count.shape} envs of up to '
                       f'{count.max(initial=0)} steps; this one holds {self._num_envs} '
                       f'envs of {self._length}')
    self._count = count.copy()
    self.sequences_emitted = int(state['sequences_emitted'])
    steps = state['steps']
    if steps is None:
      self._structure, self._buffers = None, []
      return
    self._structure = steps
    self._buffers = []
    for leaf in tree.flatten(steps):
      leaf = np.asarray(leaf)
      buf = np.zeros((self._num_envs, self._length) + leaf.shape[2:], leaf.dtype)
      buf[:, :leaf.shape[1]] = leaf
      self._buffers.append(buf)

  def reset(self, env_ids: Sequence[int]) -> None:
    """Drops the partial sequences of these envs."""
    self._count[np.asarray(env_ids, np.int64)] = 0

  def add(self, env_ids: np.ndarray, step: Nest) -> int:
    """Appends one step for each env in `env_ids` (leaves `[B, ...]`).

    Returns:
      The number of sequences completed by this step (already handed on).
    """
    env_ids = np.asarray(env_ids, np.int64)
    if self._structure is None:
      self._allocate(step)
    leaves = tree.flatten(step)
    pos = self._count[env_ids]
    for buf, leaf in zip(self._buffers, leaves):
      buf[env_ids, pos] = leaf
    self._count[env_ids] = pos + 1
    done = env_ids[self._count[env_ids] == self._length]
    if done.size == 0:
      return 0
    out = [buf[done] for buf in self._buffers]  # fancy indexing copies
    keep = self._length - self._period
    if keep:
      for buf in self._buffers:
        buf[done, :keep] = buf[done, self._period:]
    self._count[done] = keep
    self.sequences_emitted += int(done.size)
    self._on_sequences(tree.unflatten_as(self._structure, out))
    return int(done.size)
