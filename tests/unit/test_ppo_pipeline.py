"""How far ahead of PPO's learner the envs can act: the queue's size decides.

The pipeline as PPO wires it -- the trajectory writer holding `PPOBuilder.writer_pending`
items, a Reverb queue of `queue_size`, the learner's sampler taking `sampled_ahead`
items early -- with real Reverb, a producer handing over whole rounds of unrolls (as the
inference server does when lockstepped envs finish their unrolls together) and a
learner that takes a batch and trains for a while. A producer that has handed over
round r is acting round r + 1. With a queue of a batch, a round waits in the queue while
the learner trains and the next is acted; with a queue of one, a round waits in the
writer until the learner asks for it, so the envs act one round ahead (PPO's policy lag
~1 learner step; Pong at a queue of a batch: ~4, docs/atari.md).
"""

import threading
import time

import numpy as np
import pytest

ROUND = 8  # unrolls per round of the envs = the learner's batch


def _rounds_ahead(queue_size: int, batches_to_take: int = 4) -> list:
  """For each batch the learner took: the rounds it held (one value per round) and how
  many rounds the producer had fully handed over while the learner trained on it."""
  import reverb  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.agents.ppo.builder import PPOBuilder, sampled_ahead  # pylint: disable=g-import-not-at-top
  from seedacme.agents.ppo.config import PPOConfig  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.datasets import ReverbBatches  # pylint: disable=g-import-not-at-top
  from seedacme.trajectories.writer import ReverbSequenceWriter  # pylint: disable=g-import-not-at-top
  config = PPOConfig(batch_size=ROUND, queue_size=queue_size, unroll_length=8,
                     num_minibatches=1)
  server = reverb.Server([reverb.Table.queue(
      'q', config.queue_size, signature={'x': tf.TensorSpec((3,), tf.float32)})])
  client = reverb.Client(f'localhost:{server.port}')
  writer = ReverbSequenceWriter(client, 'q', lambda s: [(1.0, {'x': x}) for x in s],
                                max_pending=PPOBuilder.writer_pending)
  batches = ReverbBatches(f'localhost:{server.port}', 'q', config.batch_size,
                          timeout_ms=500, prefetch=0, max_in_flight=sampled_ahead(config))
  handed = [0]  # rounds handed over in full
  stop = threading.Event()

  def produce():
    for r in range(100):
      try:
        writer.write(np.full((ROUND, 3), r, np.float32))  # blocks: backpressure
      except Exception:  # pylint: disable=broad-except
        return  # closed at the end of the test
      handed[0] = r + 1
      if stop.is_set():
        return

  producer = threading.Thread(target=produce, daemon=True)
  producer.start()
  out = []
  try:
    while len(out) < batches_to_take:
      batch = batches.next()
      if batch is None:
        continue
      time.sleep(1.5)  # "training": long enough for the producer to run ahead
      out.append((sorted(set(batch['x'][:, 0].numpy().tolist())), handed[0]))
  finally:
    stop.set()
    writer.close()
    batches.close()
    server.stop()
    producer.join(10)
  return out


@pytest.mark.timeout(120)
def test_a_queue_of_one_keeps_the_envs_one_round_ahead_a_queue_of_a_batch_does_not():
  short = _rounds_ahead(queue_size=1)
  # Each batch is one whole round, in order. Round k's hand-over completes only as the
  # learner takes it, so round k + 1 is acted while the learner trains on k, with the
  # weights k is trained from: the learner's next step trains on it (lag 1), and the
  # producer is blocked handing it over meanwhile.
  assert [rounds for rounds, _ in short] == [[0.0], [1.0], [2.0], [3.0]], short
  assert all(handed == rounds[0] + 1 for rounds, handed in short), short
  # A queue of a batch: round k + 1 waits in it while the learner trains on k, and
  # k + 2 is acted meanwhile (lag 2 and more).
  full = _rounds_ahead(queue_size=ROUND)
  assert all(handed >= rounds[0] + 2 for rounds, handed in full[1:]), full
