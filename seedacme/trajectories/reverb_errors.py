"""Which Reverb client errors mean "the replay server is away", for every Reverb caller.

The replay node can crash and be restarted by its supervisor on the same port. Meanwhile
the trajectory writer, the learner's dataset and its priority updates must wait the
outage out rather than fail, while any other error (a missing table, a bad item) must
still surface. `is_server_away` is the one place that tells the two apart, so that all
of them agree on it.

How Reverb reports a lost server depends on the call:
- the Python client (`reverb.Client`, its trajectory writer) raises a plain
  `RuntimeError` holding only gRPC's message, without the status code. An UNAVAILABLE
  call says e.g. 'Transport closed' (the call started on a connection that was already
  closing: seen from `server_info` right after a kill), 'Socket closed', 'Connection
  reset by peer' (the server died with the request unread), 'failed to connect to all
  addresses'. So these are recognised by their text;
- `server_info(timeout=...)` raises `reverb.errors.DeadlineExceededError` when nothing
  answers in time (the server is down, or not yet listening);
- the tf.data sampling op raises `tf.errors.UnavailableError`, `CancelledError` (its
  stream was cut) or `InternalError` (gRPC turns a stream reset, 'Received RST_STREAM',
  into INTERNAL);
- the writer in this package raises `ConnectionError` itself for a stream it found lost.

A trajectory writer's `flush` timing out (also a `DeadlineExceededError`) is ambiguous:
the table may be full. The writer looks into that itself before asking this module.
"""

from typing import Any

# Lower-case pieces of gRPC's messages for a connection (not a request) that failed.
_AWAY_MESSAGES = (
    'unavailable',
    'transport closed',
    'socket closed',
    'connection reset',
    'connection refused',
    'connection closed',
    'broken pipe',
    'failed to connect',
    'endpoint read failed',
    'stream removed',
    'rst_stream',
    'goaway',
    'cancelled',
)


def is_server_away(error: BaseException) -> bool:
  """Whether `error` from a Reverb call says the server is unreachable (not the request bad)."""
  if isinstance(error, ConnectionError):
    return True
  # Imported here: whoever holds a Reverb error has these modules loaded already, and
  # importing this module stays cheap.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from reverb import errors as reverb_errors  # pylint: disable=g-import-not-at-top
  if isinstance(error, reverb_errors.DeadlineExceededError):
    return True
  if isinstance(error, (tf.errors.UnavailableError, tf.errors.CancelledError,
                        tf.errors.InternalError)):
    return True
  if isinstance(error, RuntimeError):
    text = str(error).lower()
    return any(piece in text for piece in _AWAY_MESSAGES)
  return False


def server_answers(client: Any, timeout_s: int = 2) -> bool:
  """Whether the Reverb server behind `client` answers `server_info` within `timeout_s`."""
  try:
    client.server_info(timeout=timeout_s)
    return True
  except Exception:  # pylint: disable=broad-except
    return False
