"""SequenceAssembler: fixed-length unrolls across episode ends, overlap, resets; the
Reverb writer behind it reports when queued sequences have landed."""

import numpy as np
import pytest

from seedacme.trajectories.assembler import SequenceAssembler


def _step(env_ids, t, step_type=None):
  n = len(env_ids)
  return {'t': np.full(n, t, np.int64) * 100 + np.asarray(env_ids),
          'step_type': np.ones(n, np.int8) if step_type is None else np.asarray(step_type, np.int8),
          'state': (np.full((n, 2), t, np.float32),)}


def test_unrolls_share_their_bootstrap_step():
  out = []
  asm = SequenceAssembler(num_envs=2, length=4, period=3, on_sequences=out.append)
  for t in range(10):
    asm.add(np.array([0, 1]), _step([0, 1], t))
  # Env 0: steps 0-3, 3-6, 6-9 -> three unrolls; the last step of one is the first of the next.
  ts = np.concatenate([o['t'] for o in out])
  env0 = ts[ts[:, 0] % 100 == 0] // 100
  np.testing.assert_array_equal(env0, [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]])
  assert asm.sequences_emitted == 6
  # The initial recurrent state of an unroll is the state stored with its first step.
  states = np.concatenate([o['state'][0] for o in out])
  np.testing.assert_array_equal(states[:, 0, 0], ts[:, 0] // 100)


def test_sequences_cross_episode_boundaries_unchanged():
  out = []
  asm = SequenceAssembler(num_envs=1, length=5, period=5, on_sequences=out.append)
  types = [0, 1, 2, 0, 1]  # FIRST MID LAST FIRST MID
  for t, st in enumerate(types):
    asm.add(np.array([0]), _step([0], t, [st]))
  assert len(out) == 1
  np.testing.assert_array_equal(out[0]['step_type'][0], types)


def test_envs_progress_independently_and_in_any_order():
  out = []
  asm = SequenceAssembler(num_envs=3, length=2, period=2, on_sequences=out.append)
  asm.add(np.array([2]), _step([2], 0))
  asm.add(np.array([0, 2]), _step([0, 2], 1))  # env 2 completes, env 0 has one step
  assert len(out) == 1 and out[0]['t'].shape == (1, 2)
  np.testing.assert_array_equal(out[0]['t'][0], [2, 102])
  asm.add(np.array([0]), _step([0], 2))
  np.testing.assert_array_equal(out[1]['t'][0], [100, 200])


def test_reset_drops_partial_sequence():
  out = []
  asm = SequenceAssembler(num_envs=2, length=3, period=2, on_sequences=out.append)
  asm.add(np.array([0, 1]), _step([0, 1], 0))
  asm.add(np.array([0, 1]), _step([0, 1], 1))
  asm.reset([0])  # env 0's actor restarted
  asm.add(np.array([0, 1]), _step([0, 1], 2))
  assert len(out) == 1 and out[0]['t'][0, 0] % 100 == 1  # only env 1 completed
  asm.add(np.array([0]), _step([0], 3))
  asm.add(np.array([0]), _step([0], 4))
  np.testing.assert_array_equal(out[1]['t'][0] // 100, [2, 3, 4])  # nothing from before


def test_invalid_period():
  with pytest.raises(ValueError, match='period'):
    SequenceAssembler(1, length=3, period=4, on_sequences=lambda s: None)


@pytest.mark.timeout(60)
def test_writer_reports_when_every_queued_sequence_is_in_reverb():
  import reverb

  from seedacme.trajectories.writer import ReverbSequenceWriter, WriterClosedError
  table = reverb.Table.queue('q', max_size=100)
  server = reverb.Server([table], port=None)
  try:
    client = reverb.Client(f'localhost:{server.port}')
    writer = ReverbSequenceWriter(
        client, 'q', lambda seqs: [(1.0, {'x': s}) for s in seqs['x']])
    for i in range(10):
      writer.write({'x': np.full((3, 5, 2), i, np.float32)})  # 3 sequences of length 5
    assert writer.items_queued == 30
    assert writer.wait_until_written(20)
    assert writer.items_written == 30
    assert client.server_info()['q'].current_size == 30
    writer.close()
    with pytest.raises(WriterClosedError, match='closed'):
      writer.write({'x': np.zeros((1, 5, 2), np.float32)})
  finally:
    server.stop()
