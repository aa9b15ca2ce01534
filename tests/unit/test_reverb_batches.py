"""`ReverbBatches` hands out whole batches only: what a timed-out sample left is kept.

A queue fed in bursts (each actor's round of unrolls at once) runs dry in the middle of a
batch; Reverb then ends the iterator and tf.data hands over the items it had. Those must
be neither trained on as a smaller batch nor dropped.
"""

import numpy as np
import pytest


def _insert(client, values) -> None:
  writer = client.trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=60_000)
  try:
    for v in values:
      writer.append({'x': np.full(3, v, np.float32)})
      writer.create_item('q', 1.0, {'x': writer.history['x'][-1]})
    writer.flush(timeout_ms=10_000)
  finally:
    writer.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize('with_info,max_in_flight', [(False, 1), (True, None)])
def test_partial_batches_are_completed_not_returned_or_dropped(with_info, max_in_flight,
                                                               wait_until):
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  server = reverb.Server([reverb.Table.queue(
      'q', 16, signature={'x': tf.TensorSpec((3,), tf.float32)})])
  client = reverb.Client(f'localhost:{server.port}')
  batches = ReverbBatches(f'localhost:{server.port}', 'q', 4, timeout_ms=300, prefetch=0,
                          with_info=with_info, max_in_flight=max_in_flight)
  got = []

  def batch_came():
    batch = batches.next()
    if batch is not None:
      data = batch[1] if with_info else batch
      assert data['x'].shape == (4, 3)  # never fewer
      if with_info:
        assert batch[0].key.shape == (4,)
      got.append(sorted(data['x'][:, 0].numpy().tolist()))
    return batch is not None

  try:
    _insert(client, [0, 1])
    # Two items of four: the iterator times out with them; nothing comes out ...
    assert wait_until(lambda: batch_came() or batches.partial_batches >= 1, 30, 0.05)
    assert not got and batches.partial_batches == 1
    assert not any(batch_came() for _ in range(3))
    assert client.server_info()['q'].current_size == 0  # ... and they left the table
    _insert(client, [2, 3, 4])
    assert wait_until(batch_came, 30, 0.05)
    assert got[0][:2] == [0.0, 1.0]  # the kept items first
    _insert(client, [5, 6, 7])
    assert wait_until(batch_came, 30, 0.05)
    # Every item once: none dropped, none twice.
    assert sorted(got[0] + got[1]) == [float(v) for v in range(8)], got
  finally:
    batches.close()
    server.stop()
