"""Batches of Reverb items for learners, with timeouts so learner loops stay stoppable.

A learner blocked forever inside `next(dataset)` ignores Launchpad's stop signal and
gets SIGKILLed (see shared/notes/acme-launchpad.md). `ReverbBatches.next()` instead
returns None when no complete batch arrived within `timeout_ms`, and the caller checks
its stop event. The same holds while the Reverb server is gone (the replay node crashed
and is being restarted): `next` logs that once, returns None (after a pause, not in a
tight loop) until the server is back, logs that once, and samples from the new server.
"""

import time
from typing import Any

from absl import logging

import reverb
import tensorflow as tf


def time_major(x: tf.Tensor) -> tf.Tensor:
  """`[B, T, ...]` (as items are batched) to `[T, B, ...]` (as losses want them)."""
  return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))


def batch_specs(item_signature: Any, batch_size: int) -> Any:
  """The specs of a batch of `batch_size` items with `item_signature`."""
  return tf.nest.map_structure(
      lambda s: tf.TensorSpec((batch_size,) + tuple(s.shape), s.dtype), item_signature)


class ReverbBatches:
  """Iterates `[batch_size, ...]` batches of whole items from one Reverb table."""

  def __init__(self, server_address: str, table: str, batch_size: int,
               timeout_ms: int = 1000, prefetch: int = 1, with_info: bool = False):
    """Creates the iterator (lazily: the first `next` connects).

    Args:
      server_address: Reverb server address.
      table: table to sample from.
      batch_size: items per batch.
      timeout_ms: `next` gives up after this long without a full batch.
      prefetch: batches prefetched by tf.data.
      with_info: yield `(info, data)` (keys, probabilities, table sizes: what
        prioritized replay needs) instead of `data`.
    """
    self._server_address = server_address
    self._table = table
    self._batch_size = batch_size
    self._timeout_ms = timeout_ms
    self._prefetch = prefetch
    self._with_info = with_info
    self._iterator = None
    self._down_since: float | None = None  # when the server stopped answering
    self._sampled = False  # a batch came: later failures to connect are outages

  def _make_iterator(self):
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=self._server_address, table=self._table,
        max_in_flight_samples_per_worker=2 * self._batch_size,
        rate_limiter_timeout_ms=self._timeout_ms,
        # Without a timeout this blocks while the server is down (a replay restart).
        get_signature_timeout_secs=max(1, self._timeout_ms // 1000))
    if self._with_info:
      dataset = dataset.map(lambda sample: (sample.info, sample.data))
    else:
      dataset = dataset.map(lambda sample: sample.data)
    dataset = dataset.batch(self._batch_size, drop_remainder=False)
    return iter(dataset.prefetch(self._prefetch))

  def close(self) -> None:
    """Drops the iterator and with it the sampling streams to the server."""
    self._iterator = None

  def next(self) -> Any | None:
    """The next batch (possibly smaller than batch_size when data ran short) or None."""
    try:
      if self._iterator is None:
        self._iterator = self._make_iterator()
      batch = next(self._iterator)
    except (StopIteration, tf.errors.OutOfRangeError, tf.errors.DeadlineExceededError):
      self._iterator = None  # Timed out waiting for data; a fresh iterator next time.
      return None
    except (tf.errors.UnavailableError, tf.errors.CancelledError,
            tf.errors.InternalError, reverb.errors.DeadlineExceededError) as e:
      # The server went away (or our stream to it broke): a fresh iterator next time.
      self._iterator = None
      if not self._sampled:
        time.sleep(self._timeout_ms / 1e3)  # the replay node is still starting
        return None
      if self._down_since is None:
        self._down_since = time.monotonic()
        logging.warning('Reverb server %s unreachable while sampling %r (%s); retrying',
                        self._server_address, self._table, type(e).__name__)
      time.sleep(self._timeout_ms / 1e3)  # no tight loop of failing connects
      return None
    self._sampled = True
    if self._down_since is not None:
      logging.info('Reverb server %s sampling again after %.1fs', self._server_address,
                   time.monotonic() - self._down_since)
      self._down_since = None
    return batch
