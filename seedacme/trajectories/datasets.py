"""Batches of Reverb items for learners, with timeouts so learner loops stay stoppable.

A learner blocked forever inside `next(dataset)` ignores Launchpad's stop signal and
gets SIGKILLed (see shared/notes/acme-launchpad.md). `ReverbBatches.next()` instead
returns None when no complete batch arrived within `timeout_ms`, and the caller checks
its stop event. The same holds while the Reverb server is gone (the replay node crashed
and is being restarted): `next` logs that once, returns None (after a pause, not in a
tight loop) until the server is back, logs that once, and samples from the new server.

Two ways the server's loss shows, both handled:
- creating the iterator asks the server for the table's signature; that call fails
  (with a deadline, 'Transport closed', 'Connection reset by peer', ...: what counts is
  `reverb_errors.is_server_away`);
- an iterator made before the loss does not fail at all: Reverb's sampler retries its
  stream until a server is back on the port, and `next(iterator)` blocks that long. So
  the iterator is advanced on a thread of its own (`_SamplingThread`); `next` waits for
  it at most `timeout_ms`, and when nothing came and the server does not answer, calls
  it an outage. The pending batch is taken by a later call, none is dropped.

Every batch `next` returns holds exactly `batch_size` items. When the table stays empty
longer than the rate limiter's timeout in the middle of a batch, Reverb ends the
iterator and tf.data hands over the items it had (a partial batch: seen with a queue
fed in bursts, each actor's round of unrolls at once). Those are kept and completed
from the next batch: a learner handed a partial batch retraced its step for the new
shape and trained on a batch of another size, and dropping them would lose data.

A reproducible run (`seedacme.run.schedule`) trains on rounds: `RoundBatches` takes a
round's N unrolls (one per training env) at once, checks that their env ids are
exactly 0..N-1, and hands them out in env-id order, B at a time. So the order in which
the writer inserted them, and Reverb's sampler, decide nothing. Its dataset never times
out on an empty table (`rate_limiter_timeout_ms=-1`; `next` still returns None after
`timeout_ms`, the sampling thread waits on): a timed-out Reverb iterator ends, and the
samples it had already taken off the queue went with it -- seen once at load ~13, a
round's 16 unrolls counted as sampled by the table and never seen by the learner, which
then waited for them for ever (the round gate waited for the learner).

Why ~320 lines: Reverb's dataset with its reconnects, partial batches and timeouts,
and the round-ordered batches of the reproducible schedule built on it, are one reader.
"""

import functools
import queue
import threading
import time
from typing import Any, Callable, List, Tuple

from absl import logging

import numpy as np
import reverb
import tensorflow as tf

from seedacme.trajectories.reverb_errors import is_server_away, server_answers


def time_major(x: tf.Tensor) -> tf.Tensor:
  """`[B, T, ...]` (as items are batched) to `[T, B, ...]` (as losses want them)."""
  return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))


def batch_specs(item_signature: Any, batch_size: int) -> Any:
  """The specs of a batch of `batch_size` items with `item_signature`."""
  return tf.nest.map_structure(
      lambda s: tf.TensorSpec((batch_size,) + tuple(s.shape), s.dtype), item_signature)


def _batch_iterator(server_address: str, table: str, batch_size: int, timeout_ms: int,
                    prefetch: int, with_info: bool, max_in_flight: int | None,
                    rate_limiter_timeout_ms: int | None = None):
  """A tf.data iterator of batches from `table` (see `ReverbBatches.__init__`)."""
  extra = {} if max_in_flight is None else {'num_workers_per_iterator': 1}
  dataset = reverb.TrajectoryDataset.from_table_signature(
      server_address=server_address, table=table,
      max_in_flight_samples_per_worker=max_in_flight or 2 * batch_size, **extra,
      rate_limiter_timeout_ms=(timeout_ms if rate_limiter_timeout_ms is None
                               else rate_limiter_timeout_ms),
      # Without a timeout this blocks while the server is down (a replay restart).
      get_signature_timeout_secs=max(1, timeout_ms // 1000))
  if with_info:
    dataset = dataset.map(lambda sample: (sample.info, sample.data))
  else:
    dataset = dataset.map(lambda sample: sample.data)
  dataset = dataset.batch(batch_size, drop_remainder=False)
  if prefetch:
    return iter(dataset.prefetch(prefetch))
  # No prefetch asked (on-policy data): nothing computed ahead either. tf.data's default
  # optimizations fuse map and batch into a parallel op that fills batches ahead of
  # `next`: with a queue of one, 26 items had left the table when one batch of 8 was
  # taken (a probe of the pipeline tests/unit/test_ppo_pipeline.py builds); without
  # them, 10 (the batch, one in the table, one in flight).
  options = tf.data.Options()
  options.experimental_optimization.apply_default_optimizations = False
  options.autotune.enabled = False
  return iter(dataset.with_options(options))


class _SamplingThread:
  """Advances one iterator on its own thread, one request at a time.

  `request` asks for the next element, `result` waits a bounded time for it; a result
  not taken in time stays for the next `result` call. The iterator is made (and made
  again after any failure) on the thread, so a blocked signature call or a blocked
  `next` never holds up the caller.
  """

  def __init__(self, make_iterator: Callable[[], Any], name: str):
    self._make_iterator = make_iterator
    self._requests: queue.Queue[bool] = queue.Queue()
    self._results: queue.Queue[Tuple[Any, BaseException | None]] = queue.Queue()
    self._pending = False
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._thread.start()

  def request(self) -> None:
    """Asks for the next element unless a request is still pending."""
    if not self._pending:
      self._pending = True
      self._requests.put(True)

  def result(self, timeout_s: float) -> Tuple[Any, BaseException | None] | None:
    """`(element, None)` or `(None, error)` for the pending request; None if not there yet."""
    try:
      outcome = self._results.get(timeout=timeout_s)
    except queue.Empty:
      return None
    self._pending = False
    return outcome

  def stop(self, timeout_s: float = 0.0) -> None:
    """Ends the thread (and drops its iterator) once its current request is done.

    Waits up to `timeout_s` for that; a thread blocked on a server that is gone stays
    (a daemon) until the server is back or the process ends.
    """
    self._requests.put(False)
    if timeout_s > 0 and threading.current_thread() is not self._thread:
      self._thread.join(timeout_s)

  def _run(self) -> None:
    iterator = None
    while self._requests.get():
      try:
        if iterator is None:
          iterator = self._make_iterator()
        outcome = (next(iterator), None)
      except Exception as e:  # pylint: disable=broad-except
        iterator = None  # Timed out or failed: a fresh iterator for the next request.
        outcome = (None, e)
      self._results.put(outcome)


class ReverbBatches:
  """Iterates `[batch_size, ...]` batches of whole items from one Reverb table."""

  def __init__(self, server_address: str, table: str, batch_size: int,
               timeout_ms: int = 1000, prefetch: int = 1, with_info: bool = False,
               max_in_flight: int | None = None,
               rate_limiter_timeout_ms: int | None = None):
    """Creates the iterator (lazily: the first `next` connects).

    Args:
      server_address: Reverb server address.
      table: table to sample from.
      batch_size: items per batch.
      timeout_ms: `next` gives up after this long without a full batch.
      prefetch: batches prefetched by tf.data; 0: none, and none computed ahead.
      with_info: yield `(info, data)` (keys, probabilities, table sizes: what
        prioritized replay needs) instead of `data`.
      max_in_flight: samples one worker takes off the server ahead of use (default
        2 * batch_size, over Reverb's default workers); set, one worker takes that many.
        From a queue, every sample taken ahead is policy lag: PPO keeps it to a batch.
      rate_limiter_timeout_ms: how long the dataset waits on an empty table before it
        ends (None: `timeout_ms`; -1: never, for rounds: module docstring).
    """
    self._server_address = server_address
    self._table = table
    self._batch_size = batch_size
    self._timeout_ms = timeout_ms
    self._prefetch = prefetch
    self._with_info = with_info
    self._max_in_flight = max_in_flight
    self._rate_limiter_timeout_ms = rate_limiter_timeout_ms
    self._sampler: _SamplingThread | None = None  # made by the first `next`
    self._client = None  # asks the server whether it answers, when no batch comes
    self._down_since: float | None = None  # when the server stopped answering
    self._sampled = False  # a batch came: later failures to connect are outages
    self._carry = None  # items of a partial batch, completed by the next one
    self.partial_batches = 0  # times the items at hand were short of a batch and kept

  def close(self) -> None:
    """Drops the iterator and with it the sampling streams to the server."""
    if self._sampler is not None:
      # A dataset that never times out waits for data that may never come (the last
      # round's): its thread is left to end with the server, not waited for.
      never = self._rate_limiter_timeout_ms == -1
      self._sampler.stop(0.0 if never else self._timeout_ms / 1e3 + 1.0)
      self._sampler = None

  def __del__(self):
    # Dropped without `close`: end the thread, without waiting (this may run anywhere).
    if getattr(self, '_sampler', None) is not None:
      self._sampler.stop()

  def next(self) -> Any | None:
    """The next batch of exactly `batch_size` items, or None (none complete yet)."""
    if self._sampler is None:
      # The thread gets no reference to `self`: a `ReverbBatches` dropped without
      # `close` is still collected, and `__del__` ends the thread.
      self._sampler = _SamplingThread(
          functools.partial(_batch_iterator, self._server_address, self._table,
                            self._batch_size, self._timeout_ms, self._prefetch,
                            self._with_info, self._max_in_flight,
                            self._rate_limiter_timeout_ms),
          name=f'reverb-batches-{self._table}')
    self._sampler.request()
    outcome = self._sampler.result(self._timeout_ms / 1e3)
    if outcome is None:
      # No batch yet: data is slow, or the server went away under a running iterator
      # (which then waits for a new server). Ask the server which one it is.
      if self._sampled and not server_answers(self._probe_client(), 1):
        self._note_outage('no batch and no answer to server_info')
      return None  # The request stays pending; a later call takes its batch.
    batch, error = outcome
    if error is None:
      self._sampled = True
      if self._down_since is not None:
        logging.info('Reverb server %s sampling again after %.1fs', self._server_address,
                     time.monotonic() - self._down_since)
        self._down_since = None
      return self._complete(batch)
    if isinstance(error, (StopIteration, tf.errors.OutOfRangeError,
                          tf.errors.DeadlineExceededError)):
      return None  # Timed out waiting for data; the thread makes a fresh iterator.
    if not is_server_away(error):
      raise error
    # The server went away (or our stream to it broke): a fresh iterator next time.
    if self._sampled:  # before the first batch, the replay node may still be starting
      self._note_outage(type(error).__name__)
    time.sleep(self._timeout_ms / 1e3)  # no tight loop of failing connects
    return None

  def _complete(self, batch: Any) -> Any | None:
    """`batch` after the items carried from partial batches; a batch of `batch_size`
    items, or None (kept for the next call) when there are fewer."""
    if self._carry is not None:
      batch = tf.nest.map_structure(lambda a, b: tf.concat([a, b], 0), self._carry, batch)
      self._carry = None
    size = int(tf.nest.flatten(batch)[0].shape[0])
    if size < self._batch_size:
      self.partial_batches += 1
      self._carry = batch
      return None
    if size > self._batch_size:
      self._carry = tf.nest.map_structure(lambda x: x[self._batch_size:], batch)
      batch = tf.nest.map_structure(lambda x: x[:self._batch_size], batch)
    return batch

  def _probe_client(self):
    if self._client is None:
      self._client = reverb.Client(self._server_address)
    return self._client

  def _note_outage(self, reason: str) -> None:
    """Logs the first sign of an outage; `next` logs its end with the next batch."""
    if self._down_since is None:
      self._down_since = time.monotonic()
      logging.warning('Reverb server %s unreachable while sampling %r (%s); retrying',
                      self._server_address, self._table, reason)


class RoundOrderError(RuntimeError):
  """A round's unrolls are not one per training env (one lost, one twice, one from
  another round): the run would no longer be the run its seed names."""


class RoundBatches:
  """Whole rounds of unrolls, in env-id order, `batch_size` at a time.

  `rounds` gives batches of a round's N unrolls (a `ReverbBatches` of N items with
  each item's `env_id` per step); `next` takes one, sorts it by env id and returns its
  N / `batch_size` batches in order, one per call (None while no round is there).
  """

  def __init__(self, rounds: Any, batch_size: int):
    if batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    self._rounds = rounds
    self._batch_size = batch_size
    self._pending: List[Any] = []  # the current round's batches not yet handed out
    self.rounds = 0  # rounds taken

  @property
  def partial_batches(self) -> int:
    return self._rounds.partial_batches

  def close(self) -> None:
    self._rounds.close()

  def next(self) -> Any | None:
    """The next batch of the current round, or None (no whole round yet)."""
    if not self._pending:
      data = self._rounds.next()
      if data is None:
        return None
      self._pending = self._split(data)
      self.rounds += 1
    return self._pending.pop(0)

  def _split(self, data: Any) -> List[Any]:
    """A round's batches: its unrolls sorted by env id, checked, `batch_size` each."""
    if not isinstance(data, dict) or 'env_id' not in data:
      raise RoundOrderError('a round\'s unrolls carry no env_id: the agent must store '
                            'it per step (its extras_signature)')
    ids = np.asarray(data['env_id'])
    size = ids.shape[0]
    if ids.ndim != 2 or not (ids == ids[:, :1]).all():
      raise RoundOrderError(f'env_id of shape {ids.shape} is not one id per unroll '
                            '([N, T+1], one value along each row)')
    if size % self._batch_size:
      raise RoundOrderError(f'a round of {size} unrolls does not split into batches of '
                            f'{self._batch_size}')
    ids = ids[:, 0]
    if not np.array_equal(np.sort(ids), np.arange(size)):
      counts = np.bincount(ids[(ids >= 0) & (ids < size)], minlength=size)
      missing = np.flatnonzero(counts == 0).tolist()
      twice = np.flatnonzero(counts > 1).tolist()
      outside = sorted(set(ids[(ids < 0) | (ids >= size)].tolist()))
      raise RoundOrderError(
          f'round {self.rounds}: its {size} unrolls are not one per env 0..{size - 1} '
          f'(missing {missing[:16]}, twice {twice[:16]}, outside {outside[:16]})')
    order = tf.constant(np.argsort(ids, kind='stable'))
    data = tf.nest.map_structure(lambda x: tf.gather(x, order), data)
    b = self._batch_size
    return [tf.nest.map_structure(lambda x, i=i: x[i * b:(i + 1) * b], data)
            for i in range(size // b)]
