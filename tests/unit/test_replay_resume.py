"""A resumed program starts with the replay as of its last checkpoint (`<logdir>/replay`)."""

import os
import threading
import time

import numpy as np
import portpicker
import pytest
import reverb
import tensorflow as tf

from seedacme.config import ProgramConfig
from seedacme.nodes.program import replay_checkpoint_dir
from seedacme.nodes.replay import serve_replay


def _tables():
  return [reverb.Table('t', reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                       reverb.rate_limiters.MinSize(1),
                       signature={'x': tf.TensorSpec((3,), tf.float32)})]


def _serve(port, directory, stop):
  def run():
    serve_replay(stop, port, _tables, directory, grace_s=0.0, checkpoint_interval_s=0.3)
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  return thread


def _size(client):
  return client.server_info(timeout=5)['t'].current_size


@pytest.mark.timeout(60)
def test_a_second_server_on_the_same_directory_starts_with_the_checkpointed_items(tmp_path):
  directory = str(tmp_path / 'replay')
  os.makedirs(directory)
  port = portpicker.pick_unused_port()
  stop = threading.Event()
  thread = _serve(port, directory, stop)
  client = reverb.Client(f'localhost:{port}')
  with client.trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=60_000) as writer:
    for i in range(7):
      writer.append({'x': np.full(3, i, np.float32)})
      writer.create_item('t', 1.0, {'x': writer.history['x'][-1]})
  assert _size(client) == 7
  # Wait for a checkpoint that holds all seven (written every 0.3 s).
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline and not any(
      os.path.isfile(os.path.join(directory, d, 'DONE')) for d in os.listdir(directory)):
    time.sleep(0.2)
  time.sleep(1.0)  # one more period: a checkpoint taken after the last insert
  stop.set()
  thread.join(30)
  assert os.listdir(directory)  # the checkpoint outlives the server

  stop2 = threading.Event()
  thread2 = _serve(port, directory, stop2)
  client2 = reverb.Client(f'localhost:{port}')
  deadline = time.monotonic() + 20
  size = 0
  while time.monotonic() < deadline:
    try:
      size = _size(client2)
      break
    except Exception:  # pylint: disable=broad-except  (still starting)
      time.sleep(0.2)
  assert size == 7
  values = {float(np.ravel(tf.nest.flatten(s[0].data)[0])[0])
            for s in client2.sample("t", num_samples=50)}
  assert values <= set(range(7)) and len(values) > 1
  stop2.set()
  thread2.join(30)



def test_the_program_keeps_replay_checkpoints_in_the_logdir_only_when_it_checkpoints():
  config = ProgramConfig(logdir='/tmp/run_x', checkpoint_interval_s=60.0)
  assert replay_checkpoint_dir(config, 30.0) == '/tmp/run_x/replay'
  assert replay_checkpoint_dir(config, None) is None  # the agent keeps no replay
  assert replay_checkpoint_dir(ProgramConfig(logdir='/tmp/run_x',
                                             checkpoint_interval_s=None), 30.0) is None
  assert replay_checkpoint_dir(ProgramConfig(logdir='gs://bucket/run',
                                             checkpoint_interval_s=60.0), 30.0) is None
