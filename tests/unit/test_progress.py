"""Progress records: JSON lines, TensorBoard events, console line, curves."""

import glob
import json
import os

from seedacme.run.curves import full_windows, read_progress, write_curves
from seedacme.run.progress import ProgressWriter, format_line


def test_records_events_summary_and_curves(tmp_path):
  logdir = str(tmp_path / 'run')
  writer = ProgressWriter(logdir)
  for i in range(3):
    writer.write({'elapsed_s': 5.0 * i, 'env_steps': 100 * i, 'average_return': i - 1.0,
                  'eval_average_return': float('nan'), 'learner_steps': 10 * i})
  writer.log_event('resumed from checkpoint at learner step 20')
  writer.write_summary({'stopped_because': 'done', 'average_return': 1.0})
  lines = [json.loads(x) for x in open(os.path.join(logdir, 'progress.jsonl'))]
  assert len(lines) == 4 and lines[-1] == {'event': 'resumed from checkpoint at learner step 20'}
  assert lines[0]['eval_average_return'] is None  # NaN is stored as null (valid JSON)
  assert json.load(open(os.path.join(logdir, 'summary.json')))['stopped_because'] == 'done'
  assert glob.glob(os.path.join(logdir, 'tensorboard', 'events.out.tfevents.*'))
  assert [r['env_steps'] for r in read_progress(logdir)] == [0, 100, 200]
  paths = write_curves(logdir, 'test')
  rows = open(paths['csv']).read().splitlines()
  assert rows[0].startswith('env_steps,') and len(rows) == 4
  assert os.path.getsize(paths['png']) > 1000


def test_after_a_resume_only_full_windows_count():
  # A fresh run: partial windows count (the average covers every episode so far).
  fresh = [{'elapsed_s': 5.0, 'episodes': 3}, {'elapsed_s': 10.0, 'episodes': 150}]
  assert full_windows(fresh) == [True, True]
  # Resumed at 150 episodes (clock back to 0): 3 and 99 new episodes are partial
  # windows, 100 a full one; a record's own `average_over` wins when present.
  resumed = fresh + [{'elapsed_s': 4.0, 'episodes': 153}, {'elapsed_s': 9.0, 'episodes': 249},
                     {'elapsed_s': 14.0, 'episodes': 250}]
  assert full_windows(resumed) == [True, True, False, False, True]
  assert full_windows([{'elapsed_s': 1.0, 'episodes': 2209, 'average_over': 3},
                       {'elapsed_s': 2.0, 'episodes': 2400, 'average_over': 100}]) == [False, True]


def test_format_line_handles_missing_fields():
  line = format_line({'elapsed_s': 12.0, 'env_steps': 1234, 'average_return': None,
                      'learner_priority_updates': 64.0, 'replay_size': 5})
  assert '1,234' in line and 'return -' in line and 'priority updates 64' in line
  assert 'priority updates' not in format_line({})


def test_a_remote_logdir_gets_progress_curves_and_checkpoints_through_gfile():
  # `ram://` is TensorFlow's in-memory file system: the same `tf.io.gfile` layer a
  # `gs://` logdir goes through on Vertex AI, without a bucket.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.learner.checkpointing import Checkpointer  # pylint: disable=g-import-not-at-top
  logdir = 'ram://seedacme_test_remote_logdir'
  writer = ProgressWriter(logdir)
  for i in range(3):
    writer.write({'elapsed_s': 1.0 * i, 'env_steps': 10 * i, 'average_return': 0.5 * i})
  writer.write_summary({'stopped_because': 'done'})
  assert [r['env_steps'] for r in read_progress(logdir)] == [0, 10, 20]
  with tf.io.gfile.GFile(f'{logdir}/summary.json') as f:
    assert json.load(f)['stopped_because'] == 'done'
  paths = write_curves(logdir, 'remote')
  with tf.io.gfile.GFile(paths['csv']) as f:
    assert len(f.read().splitlines()) == 4
  with tf.io.gfile.GFile(paths['png'], 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  weights = tf.Variable([1.0, 2.0])
  saver = Checkpointer(f'{logdir}/checkpoints', {'weights': weights})
  saver.save({'learner_steps': 7, 'env_steps': 70, 'episodes': 3})
  weights.assign([0.0, 0.0])
  restored = Checkpointer(f'{logdir}/checkpoints', {'weights': weights}).restore()
  assert restored == {'learner_steps': 7, 'env_steps': 70, 'episodes': 3}
  assert weights.numpy().tolist() == [1.0, 2.0]
  tf.io.gfile.rmtree(logdir)
