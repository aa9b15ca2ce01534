"""`ReverbSequenceWriter` moves completed sequences to a Reverb table on a background
thread through a bounded queue: when the table's rate limiter blocks (the learner is
behind), the queue fills and `write` blocks the inference thread, so actors wait
instead of memory growing. When the Reverb server goes away (the replay node crashed
and its supervisor restarts it), the writer logs it once, waits for the server to
answer again, and logs that once. Reverb's own trajectory writer then sends its
unconfirmed items again on a new stream by itself (`TrajectoryWriter`'s stream worker
requeues them on UNAVAILABLE); ours waits for that flush with the same stall rule, and
only if the old stream never delivers does it close it, without a flush, and write those
items again on a new one (`items_rewritten`). Rewriting whenever the server had gone
(what this did first) put the 4 items written during an outage into the table twice in
2 of 5 runs of `tests/unit/test_replay_restart.py`: the closing flush or Reverb's own
resend had already delivered them. Nothing handed to the writer is lost, and nothing is
written twice unless the old stream delivers after seconds of silence. Only an error
while the server answers is fatal.
"""

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

from absl import logging
import tree

from seedacme.runtime.lifecycle import ShutdownError
from seedacme.trajectories.reverb_errors import is_server_away, server_answers
from seedacme.types import Nest

# Batch of sequences `[N, length, ...]` -> N (priority, Reverb item) pairs.
ToItems = Callable[[Nest], Sequence[Tuple[float, Dict[str, Any]]]]


# How long a stream gets, once the server answers again, to deliver by Reverb's resend.
_RESEND_GRACE_S = 5.0


class _StreamLost(ConnectionError):
  """The old stream did not deliver after the server came back (already logged)."""


class WriterClosedError(ShutdownError):
  """The writer was closed while a caller waited to hand it sequences."""


class ReverbSequenceWriter:
  """Writes whole sequences as single Reverb items from a background thread."""

  def __init__(self, client, table: str,
               to_items: ToItems,
               max_pending: int = 64, flush_timeout_ms: int = 500,
               stall_check_s: float = 3.0):
    """Creates the writer.

    Args:
      client: a `reverb.Client`.
      table: name of the table to insert into.
      to_items: turns a batch of sequences `[N, length, ...]` into N
        `(priority, item)` pairs.
      max_pending: bound of the queue between the inference thread and Reverb.
      flush_timeout_ms: how long one blocking flush waits before re-checking `close`.
      stall_check_s: after a flush stalled this long, check whether the stream to the
        server was lost (the server restarted) rather than held back by the table.
    """
    self._client = client
    self._table = table
    self._to_items = to_items
    self._flush_timeout_ms = flush_timeout_ms
    self._stall_check_s = stall_check_s
    self._queue: queue.Queue[Dict[str, Any]] = queue.Queue(maxsize=max_pending)
    self._closed = threading.Event()
    self.items_queued = 0
    self.items_written = 0
    self.blocked_seconds = 0.0
    self.items_rewritten = 0  # unconfirmed when the server went away, written again
    self.reconnects = 0
    self._in_flight: List[Tuple[float, Dict[str, Any]]] = []
    self.error: BaseException | None = None
    self._thread = threading.Thread(target=self._loop, name=f'reverb-writer-{table}',
                                    daemon=True)
    self._thread.start()

  def write(self, sequences: Nest) -> None:
    """Queues a batch of sequences; blocks while the queue is full (backpressure)."""
    if self.error is not None:
      raise RuntimeError(f'Reverb writer for table {self._table!r} failed') from self.error
    for entry in self._to_items(sequences):
      start = time.monotonic()
      while True:
        if self._closed.is_set():
          raise WriterClosedError(f'writer for table {self._table!r} is closed')
        try:
          self._queue.put(entry, timeout=0.1)
          self.items_queued += 1
          break
        except queue.Full:
          continue
      self.blocked_seconds += time.monotonic() - start

  @property
  def pending(self) -> int:
    return self._queue.qsize()

  def _loop(self) -> None:
    # The replay node may still be starting: wait quietly for its first answer.
    while not self._closed.is_set() and not self.server_reachable():
      self._closed.wait(0.5)
    while not self._closed.is_set():
      try:
        self._write_until_failure()
        return
      except BaseException as e:  # pylint: disable=broad-except
        if self._closed.is_set():
          return
        # The server away (by the error, e.g. 'Transport closed', or by not answering):
        # wait for it. An error while it answers is a real one.
        if not (is_server_away(e) or not self.server_reachable()):
          logging.exception('Reverb writer for table %r failed', self._table)
          self.error = e
          return
        if not isinstance(e, _StreamLost):  # not yet reported (e.g. opening a stream)
          self._wait_for_server(e)

  def _write_until_failure(self) -> None:
    # No `with`: the context manager's exit flushes without a timeout, which would hang
    # shutdown while the table is full.
    try:
      writer = self._client.trajectory_writer(num_keep_alive_refs=1)
    except Exception as e:  # pylint: disable=broad-except
      raise ConnectionError(f'could not open a stream: {e}') from e
    abandoned = False
    try:
      while not self._closed.is_set():
        if self._in_flight:
          items = self._in_flight  # the last stream never delivered them: again
          self.items_rewritten += len(items)
          logging.info('Reverb writer for table %r: writing %d undelivered items again on '
                       'a new stream', self._table, len(items))
        else:
          try:
            items = [self._queue.get(timeout=0.1)]
          except queue.Empty:
            continue
        # At most 32 items per flush, and no more than the queue's bound: a writer asked
        # to hold little (PPO's on-policy queue) must not hold a flush's worth more.
        while len(items) < min(32, self._queue.maxsize):
          try:
            items.append(self._queue.get_nowait())
          except queue.Empty:
            break
        self._in_flight = items
        for priority, item in items:
          writer.append(item)
          writer.create_item(self._table, float(priority),
                             tree.map_structure(lambda col: col[-1], writer.history))
        try:
          self._deliver(writer)
        except _StreamLost:
          abandoned = True
          raise
        if self._closed.is_set():
          return  # unconfirmed; the best-effort flush below may still deliver them
        self.items_written += len(items)
        self._in_flight = []
    finally:
      # A stream we give up on is closed without a flush: whatever it delivers later
      # would be in the table twice, since its items are written again.
      if not abandoned:
        try:
          writer.flush(timeout_ms=1000)  # Best effort for what is already in flight.
        except Exception:  # pylint: disable=broad-except
          pass
      try:
        writer.close()
      except Exception:  # pylint: disable=broad-except
        pass

  def _deliver(self, writer) -> None:
    """Flushes; if the stream was lost, waits for the server and for Reverb's own resend.

    Raises `_StreamLost` when the old stream does not deliver once the server is back:
    the caller then closes it and writes the items again.
    """
    try:
      self._flush(writer, self._stall_check_s)
      return
    except ConnectionError as e:
      self._wait_for_server(e)
    if self._closed.is_set():
      return
    # Reverb's writer resends on a new stream after a backoff of at most 1 s, once its
    # channel reconnects (which our `server_info` just did): a few seconds suffice.
    try:
      self._flush(writer, max(self._stall_check_s, _RESEND_GRACE_S))
    except ConnectionError as e:
      raise _StreamLost(f'the old stream did not deliver after the server came back: {e}') from e

  def server_reachable(self, timeout_s: int = 2) -> bool:
    """Whether the Reverb server answers `server_info` within `timeout_s`."""
    return server_answers(self._client, timeout_s)

  def _wait_for_server(self, error: BaseException) -> None:
    """The replay server is gone (crashed, restarting): one line now, one when it is back.

    The queue keeps what inference hands over until it is full, then inference waits.
    """
    self.reconnects += 1
    logging.warning('Reverb server for table %r unreachable (%s: %s); %d unconfirmed '
                    'items kept; reconnecting', self._table,
                    type(error).__name__, str(error).splitlines()[0][:200] if str(error) else '',
                    len(self._in_flight))
    started = time.monotonic()
    while not self._closed.is_set() and not self.server_reachable():
      self._closed.wait(0.5)
    if not self._closed.is_set():
      logging.info('Reverb server for table %r reachable again after %.1fs', self._table,
                   time.monotonic() - started)

  def _flush(self, writer, stall_check_s: float) -> None:
    from reverb import errors as reverb_errors  # pylint: disable=g-import-not-at-top
    stalled_since = time.monotonic()
    while not self._closed.is_set():
      try:
        writer.flush(timeout_ms=self._flush_timeout_ms)
        return
      except reverb_errors.DeadlineExceededError as e:
        # The table is full (its rate limiter holds us back) -- or our stream died
        # with the server, which a flush shows only as a timeout, also after a new
        # server took the port. Every few seconds, look which one it is.
        if time.monotonic() - stalled_since > stall_check_s:
          if self._stream_lost():
            raise ConnectionError('no flush for %.0fs and the table would accept '
                                  'inserts (or the server does not answer): the stream '
                                  'is lost' % (time.monotonic() - stalled_since)) from e
          stalled_since = time.monotonic()

  def _table_accepts_inserts(self) -> bool:
    """Whether the table's rate limiter would admit an insert now (raises if unreachable)."""
    info = self._client.server_info(timeout=2)[self._table]
    limiter = info.rate_limiter_info
    if info.current_size < limiter.min_size_to_sample:
      return True
    diff = ((limiter.insert_stats.completed + 1) * limiter.samples_per_insert
            - limiter.sample_stats.completed)
    return diff <= limiter.max_diff

  def _stream_lost(self) -> bool:
    """A stalled flush while the server answers and would take inserts: stream lost."""
    try:
      # Twice, a moment apart: a sample may just have made room for our own insert.
      if not self._table_accepts_inserts():
        return False
      time.sleep(0.5)
      return self._table_accepts_inserts()
    except Exception:  # pylint: disable=broad-except
      return True  # the server does not answer


  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    """Waits until every item queued so far is in Reverb; False on timeout or failure.

    `write` returns once an item is queued; the background thread inserts it a little
    later. Call this after the last `write` when the table's contents must be settled
    (for instance before counting its items).
    """
    deadline = time.monotonic() + timeout_s
    while self.items_written < self.items_queued:
      if self.error is not None or self._closed.is_set() or time.monotonic() > deadline:
        return False
      time.sleep(0.01)
    return True

  def close(self, timeout_s: float = 5.0) -> None:
    self._closed.set()
    self._thread.join(timeout_s)
