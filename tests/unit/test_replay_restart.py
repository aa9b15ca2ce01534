"""A Reverb server killed and restarted on its port (what the supervised replay node does):
the trajectory writer and the learner's dataset reconnect by themselves, and a restarted
server loads the latest checkpoint the replay process wrote."""

import os
import time

import numpy as np
import portpicker
import pytest

from tests.unit.subprocess_server import ServerProcess

_SERVER = '''
import sys, threading
import reverb, tensorflow as tf
from absl import logging
from seedacme.nodes.replay import serve_replay

logging.set_verbosity(logging.INFO)  # as the supervised child sets it
port, ckdir = int(sys.argv[1]), sys.argv[2]
tables = lambda: [reverb.Table.queue('q', 1000, signature={'x': tf.TensorSpec((3,), tf.float32)})]
serve_replay(threading.Event(), port, tables, ckdir, grace_s=0.0,
             checkpoint_interval_s=0.5)
'''


@pytest.mark.timeout(120)
def test_writer_and_dataset_reconnect_and_the_table_is_restored(tmp_path, wait_until):
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.writer import ReverbSequenceWriter  # pylint: disable=g-import-not-at-top

  port = portpicker.pick_unused_port()
  checkpoint_dir = str(tmp_path / 'checkpoints')
  os.makedirs(checkpoint_dir)
  log = str(tmp_path / 'server.log')
  server = ServerProcess(_SERVER, [str(port), checkpoint_dir], log)
  client = reverb.Client(f'localhost:{port}')
  writer = batches = None
  try:
    client.server_info(timeout=60)
    size = lambda: client.server_info(timeout=2)['q'].current_size  # noqa: E731
    writer = ReverbSequenceWriter(client, 'q', lambda s: [(1.0, {'x': x}) for x in s],
                                  stall_check_s=1.0)
    batches = ReverbBatches(f'localhost:{port}', 'q', 4, timeout_ms=500)
    writer.write(np.ones((12, 3), np.float32))
    assert writer.wait_until_written(10)
    assert wait_until(lambda: size() == 12, 5, 0.1)
    time.sleep(1.5)  # a checkpoint holding those 12
    server.kill()

    # While the server is down: the dataset answers None (not an exception, not a hang),
    # and the writer keeps what it is handed.
    started = time.monotonic()
    assert batches.next() is None and batches.next() is None
    assert time.monotonic() - started < 10
    writer.write(np.full((4, 3), 2.0, np.float32))
    server = ServerProcess(_SERVER, [str(port), checkpoint_dir], log)
    assert wait_until(lambda: writer.reconnects == 1 and writer.items_written == 16, 60, 0.1), \
        (writer.reconnects, writer.items_written, writer.items_rewritten, open(log).read()[-2000:])
    assert writer.error is None
    # The 12 restored from the checkpoint plus the 4 written after the restart.
    assert wait_until(lambda: size() == 16, 10, 0.1), size()
    assert 'restored the latest checkpoint' in open(log).read()
    assert wait_until(lambda: batches.next() is not None, 30, 0.1)  # sampling again
    # Only the newest checkpoint is kept.
    assert len(os.listdir(checkpoint_dir)) <= 2
  finally:
    if writer is not None:
      writer.close()
    if batches is not None:
      batches.close()
    server.kill()
