"""Cross-caller request batching: the hot path of central inference.

Courier runs each actor's `step` call on its own handler thread. Those threads hand
their request to a `RequestBatcher`, which joins requests from many callers until
`max_batch_size` units (envs) are waiting or `timeout_s` has passed since the first
request of the batch arrived, calls `process_fn` once on the whole list and gives
every caller its own result -- or its own exception, so one bad request never fails
its neighbours.

There is no batching thread. One of the waiting handler threads *leads*: the caller
whose request fills the batch, or the batch's first caller when its timeout passes,
runs `process_fn` on its own thread and hands the others their results. Measured here
(bench/inference_service.py) a dedicated batching thread cost two extra thread
wake-ups on every batch's critical path: the batcher path served ~45 % of a bare
Courier echo's requests/s, the leader path ~70 % (2 callers, 16 envs each). Batches
are still processed one at a time, in arrival order: a batch that fills while
another is being processed waits for it.

A reproducible run (`ProgramConfig.reproducible`, issue 63) batches by rounds instead
(`RoundBatcher`): a training batch is exactly one request of every training env, taken
when the last of them arrives, however long that takes (no timeout, no fill target); a
second request for an env already in the forming round (a Courier retry, a restarted
actor's while its predecessor's still waits) is held for the next round, and counted.
Evaluation requests never join a training batch: they run on their own, as soon as the
policy is free.
"""

import collections
import threading
import time
from typing import Any, Callable, Generic, List, NamedTuple, Sequence, TypeVar, Union

from absl import logging
import numpy as np

from seedacme.runtime.lifecycle import ShutdownError

T = TypeVar('T')
R = TypeVar('R')

ProcessFn = Callable[[Sequence[T]], Sequence[Union[R, BaseException]]]

_NOT_DONE = object()


class BatcherClosedError(ShutdownError):
  """Raised to callers whose request is pending when the batcher shuts down."""


class _Pending:
  """One caller's request and, once its batch ran, its result."""
  __slots__ = ('item', 'size', 'submitted', 'result', 'eager', 'key')

  def __init__(self, item: Any, size: int, submitted: float, eager: bool = False):
    self.item = item
    self.size = size
    self.submitted = submitted
    self.result: Any = _NOT_DONE
    self.eager = eager
    self.key: Any = None  # `RoundBatcher`: (training env ids, or None for evaluation)


class BatcherStats(NamedTuple):
  batches: int
  items: int  # requests processed
  units: int  # envs processed
  full_batches: int  # batches that reached max_batch_size before the timeout
  mean_batch_units: float
  mean_latency_ms: float  # submit -> result, averaged since the last `stats(reset=True)`
  p99_latency_ms: float


class RequestBatcher(Generic[T, R]):
  """Batches requests from many threads into single `process_fn` calls."""

  def __init__(self, process_fn: ProcessFn, max_batch_size: int, timeout_s: float,
               name: str = 'batcher', latency_window: int = 4096):
    if max_batch_size < 1:
      raise ValueError(f'max_batch_size must be >= 1, got {max_batch_size}')
    self._process_fn = process_fn
    self._max_batch_size = max_batch_size
    self._timeout_s = timeout_s
    self._name = name
    self._cond = threading.Condition(threading.Lock())
    self._open: List[_Pending] = []  # the batch being formed
    self._open_units = 0
    self._busy = False  # a leader is running process_fn
    self._closed = False
    self._batches = self._items = self._units = self._full = 0
    self._latencies = collections.deque(maxlen=latency_window)

  @property
  def max_batch_size(self) -> int:
    return self._max_batch_size

  def __call__(self, item: T, size: int = 1, eager: bool = False) -> R:
    """Adds `item` (worth `size` units) to the forming batch; returns its own result
    once the batch ran (or raises its own exception).

    `eager`: the batch runs as soon as the policy is free, full or not (a caller that
    already waited for its own batch to fill, as the shared-memory server does).
    """
    mine = _Pending(item, size, time.monotonic(), eager)
    self._prepare(mine)
    with self._cond:
      if self._closed:
        raise BatcherClosedError('inference server is shutting down')
      self._open.append(mine)
      self._open_units += size
      while mine.result is _NOT_DONE:
        batch = self._take_if_ready(mine)
        if batch is not None:
          break
        self._cond.wait(self._wait_time(mine))
      else:
        return self._unwrap(mine.result)
    self._lead(batch)
    return self._unwrap(mine.result)

  def _prepare(self, pending: _Pending) -> None:
    """Before `pending` joins the open batch, on its caller's thread (no lock held)."""

  @property
  def closed(self) -> bool:
    """Whether intake has stopped (`stop_intake`, `close`)."""
    return self._closed

  def _deadline(self) -> float:
    return self._open[0].submitted + self._timeout_s

  def _take_if_ready(self, mine: _Pending) -> List[_Pending] | None:
    """With the lock held: the open batch, if `mine` is in it and it should run now."""
    if self._busy or not self._open or mine not in self._open:
      return None
    if (self._open_units < self._max_batch_size and time.monotonic() < self._deadline()
        and not any(p.eager for p in self._open)):
      return None
    batch, self._open, self._open_units = self._open, [], 0
    self._busy = True
    return batch

  def _wait_time(self, mine: _Pending) -> float:
    """How long to sleep before looking again (woken early by a finished batch)."""
    if self._open and self._open[0] is mine and not self._busy:
      return max(self._deadline() - time.monotonic(), 0.0) + 1e-5
    if mine.eager and not self._busy:
      return 1e-4
    return 0.1

  @staticmethod
  def _unwrap(result: Any) -> Any:
    if isinstance(result, BaseException):
      raise result
    return result

  def _lead(self, batch: List[_Pending]) -> None:
    """Runs `process_fn` for `batch` on this (the leader's) thread."""
    try:
      results = self._process_fn([p.item for p in batch])
      if len(results) != len(batch):
        raise RuntimeError(f'process_fn returned {len(results)} results for '
                           f'{len(batch)} requests')
    except ShutdownError as e:
      logging.info('Batch of %d requests dropped at shutdown: %s', len(batch), e)
      results = [e] * len(batch)
    except BaseException as e:  # pylint: disable=broad-except
      logging.exception('%s: batch of %d requests failed', self._name, len(batch))
      results = [e] * len(batch)
    now = time.monotonic()
    units = sum(p.size for p in batch)
    with self._cond:
      for pending, result in zip(batch, results):
        pending.result = result
      self._batches += 1
      self._items += len(batch)
      self._units += units
      self._full += units >= self._max_batch_size
      self._latencies.extend(now - p.submitted for p in batch)
      self._busy = False
      self._cond.notify_all()  # results are in; a waiting full batch may lead now

  def pending(self) -> int:
    """Units (envs) in the batch being formed, not yet running."""
    with self._cond:
      return self._open_units

  def stats(self, reset: bool = False) -> BatcherStats:
    """Counters since the last reset."""
    with self._cond:
      lat = sorted(self._latencies)
      stats = BatcherStats(
          batches=self._batches, items=self._items, units=self._units,
          full_batches=self._full,
          mean_batch_units=self._units / max(self._batches, 1),
          mean_latency_ms=1e3 * sum(lat) / max(len(lat), 1),
          p99_latency_ms=1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0)
      if reset:
        self._batches = self._items = self._units = self._full = 0
        self._latencies.clear()
    return stats

  def stop_intake(self) -> None:
    """Refuses new requests; requests not yet in a running batch fail with
    BatcherClosedError; the batch being processed finishes."""
    with self._cond:
      self._closed = True
      for pending in self._open:
        pending.result = BatcherClosedError('inference server is shutting down')
      self._open, self._open_units = [], 0
      self._cond.notify_all()

  def close(self, timeout_s: float = 5.0) -> None:
    """Like `stop_intake`, then waits up to `timeout_s` for a running batch to finish."""
    self.stop_intake()
    deadline = time.monotonic() + timeout_s
    with self._cond:
      while self._busy and time.monotonic() < deadline:
        self._cond.wait(max(deadline - time.monotonic(), 0.0))


class RoundBatcher(RequestBatcher[T, R]):
  """Training batches of exactly one request of every training env (module docstring).

  `keys(item)` says what an item is: the int array of the training env ids it holds
  (each in 0..num_envs-1), or None for an evaluation item. A training batch runs once
  the open items, taken in arrival order and skipping any whose envs are already
  covered, cover all `num_envs` envs: its leader is the caller whose item completed it
  (or, if the policy was busy then, whichever of its callers wakes first). Evaluation
  items run together, alone, as soon as the policy is free. `held` counts training
  items that had to wait for a later round because their envs were already covered.
  """

  def __init__(self, process_fn: ProcessFn, num_envs: int,
               keys: Callable[[Any], Any], name: str = 'round-batcher',
               latency_window: int = 4096):
    super().__init__(process_fn, max_batch_size=num_envs, timeout_s=0.0, name=name,
                     latency_window=latency_window)
    self._num_envs = num_envs
    self._keys = keys
    self.held = 0

  def _prepare(self, pending: _Pending) -> None:
    ids = self._keys(pending.item)
    if ids is not None:
      ids = np.asarray(ids, np.int64)
      if ids.size and (ids.min() < 0 or ids.max() >= self._num_envs):
        raise ValueError(f'{self._name}: training env ids must be in 0..'
                         f'{self._num_envs - 1}, got {sorted(set(ids.tolist()))[:16]}')
    pending.key = ids

  def _take_if_ready(self, mine: _Pending) -> List[_Pending] | None:
    if self._busy or mine not in self._open:
      return None
    if mine.key is None:  # evaluation: every waiting evaluation item, now
      batch = [p for p in self._open if p.key is None]
    elif self._open_units < self._num_envs:  # cannot cover every env yet (no scan)
      return None
    else:
      covered = np.zeros(self._num_envs, bool)
      batch, held = [], 0
      for p in self._open:
        if p.key is None:
          continue
        if covered[p.key].any():
          held += 1
          continue
        covered[p.key] = True
        batch.append(p)
      if not covered.all() or mine not in batch:
        return None
      self.held += held
    taken = set(map(id, batch))
    self._open = [p for p in self._open if id(p) not in taken]
    self._open_units -= sum(p.size for p in batch)
    self._busy = True
    return batch

  def _wait_time(self, mine: _Pending) -> float:
    # Woken by every finished batch; a round completes on its last caller's thread.
    return 1.0
