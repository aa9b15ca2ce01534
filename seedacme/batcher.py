"""Cross-caller request batching: the hot path of central inference.

Courier runs each actor's `step` call on its own handler thread. Those threads hand
their request to a `RequestBatcher` and wait on a future. One batching thread
collects requests until `max_batch_size` units (envs) are waiting or `timeout_s` has
passed since the first request of the batch arrived, then calls `process_fn` once on
the whole list and gives every caller its own result -- or its own exception, so one
bad request never fails its neighbours.
"""

import collections
import queue
import threading
import time
from concurrent import futures
from typing import Callable, Generic, List, NamedTuple, Sequence, TypeVar, Union

from absl import logging

from seedacme.lifecycle import ShutdownError

T = TypeVar('T')
R = TypeVar('R')

ProcessFn = Callable[[Sequence[T]], Sequence[Union[R, BaseException]]]


class BatcherClosedError(ShutdownError):
  """Raised to callers whose request is pending when the batcher shuts down."""


class _Pending(NamedTuple):
  item: object
  size: int
  future: futures.Future
  submitted: float


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
    self._queue: queue.Queue[_Pending] = queue.Queue()
    self._closed = threading.Event()
    self._lock = threading.Lock()
    self._batches = self._items = self._units = self._full = 0
    self._latencies = collections.deque(maxlen=latency_window)
    self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
    self._thread.start()

  @property
  def max_batch_size(self) -> int:
    return self._max_batch_size

  def submit(self, item: T, size: int = 1) -> 'futures.Future[R]':
    """Queues `item` (worth `size` units of the batch); returns its future."""
    future = futures.Future()
    if self._closed.is_set():
      future.set_exception(BatcherClosedError('inference server is shutting down'))
      return future
    self._queue.put(_Pending(item, size, future, time.monotonic()))
    return future

  def __call__(self, item: T, size: int = 1) -> R:
    """Submits and waits for the result (raises the caller's own exception)."""
    return self.submit(item, size).result()

  def _collect(self) -> List[_Pending]:
    try:
      first = self._queue.get(timeout=0.1)
    except queue.Empty:
      return []
    batch, units = [first], first.size
    deadline = time.monotonic() + self._timeout_s
    while units < self._max_batch_size:
      remaining = deadline - time.monotonic()
      try:
        nxt = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
      except queue.Empty:
        break
      batch.append(nxt)
      units += nxt.size
    return batch

  def _loop(self) -> None:
    while not self._closed.is_set():
      batch = self._collect()
      if not batch:
        continue
      try:
        results = self._process_fn([p.item for p in batch])
        if len(results) != len(batch):
          raise RuntimeError(f'process_fn returned {len(results)} results for '
                             f'{len(batch)} requests')
      except ShutdownError as e:
        logging.info('Batch of %d requests dropped at shutdown: %s', len(batch), e)
        results = [e] * len(batch)
      except BaseException as e:  # pylint: disable=broad-except
        logging.exception('Batch of %d requests failed', len(batch))
        results = [e] * len(batch)
      now = time.monotonic()
      units = sum(p.size for p in batch)
      with self._lock:
        self._batches += 1
        self._items += len(batch)
        self._units += units
        self._full += units >= self._max_batch_size
        self._latencies.extend(now - p.submitted for p in batch)
      for pending, result in zip(batch, results):
        if isinstance(result, BaseException):
          pending.future.set_exception(result)
        else:
          pending.future.set_result(result)
    self._fail_pending()

  def _fail_pending(self) -> None:
    while True:
      try:
        pending = self._queue.get_nowait()
      except queue.Empty:
        return
      pending.future.set_exception(BatcherClosedError('inference server is shutting down'))

  def stats(self, reset: bool = False) -> BatcherStats:
    """Counters since the last reset."""
    with self._lock:
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
    """Refuses new requests (BatcherClosedError); the batch in flight may finish."""
    self._closed.set()

  def close(self, timeout_s: float = 5.0) -> None:
    """Stops the batching thread; pending and later requests fail with BatcherClosedError."""
    self._closed.set()
    self._thread.join(timeout_s)
    self._fail_pending()
