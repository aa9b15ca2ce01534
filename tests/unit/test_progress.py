"""Progress records: JSON lines, TensorBoard events, console line, curves; writes that a
kill cannot tear (local, TF's `ram://`, and a file system that behaves like GCS)."""

import glob
import json
import os
import uuid

import pytest

from seedacme.run import logdir as logdir_lib
from seedacme.run.curves import (curve_step, full_windows, published_curve, read_progress,
                                  write_curves)
from seedacme.run.logdir import read_events, read_summary
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


# ---- writes a kill cannot tear -------------------------------------------------------
class _Killed(BaseException):
  """A kill arriving in the middle of a write (nothing after it runs)."""


def _kill_writes_under(monkeypatch, prefix):
  """From now on every write of a file under `prefix` dies halfway, whichever layer
  (`open`, `tf.io.gfile.GFile`) does it."""
  import builtins  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  class Dying:
    def __init__(self, f):
      self._f = f

    def write(self, data):
      self._f.write(data[:len(data) // 2])
      self._f.flush()
      raise _Killed()

    def __getattr__(self, name):
      return getattr(self._f, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self._f.close()

  real_open, real_gfile = builtins.open, tf.io.gfile.GFile

  def dying_open(path, mode='r', *args, **kwargs):
    f = real_open(path, mode, *args, **kwargs)
    return Dying(f) if str(path).startswith(prefix) and 'w' in mode else f

  def dying_gfile(path, mode='r'):
    f = real_gfile(path, mode)
    return Dying(f) if str(path).startswith(prefix) and 'w' in mode else f

  monkeypatch.setattr(builtins, 'open', dying_open)
  monkeypatch.setattr(tf.io.gfile, 'GFile', dying_gfile)


@pytest.mark.parametrize('where', ['local', 'ram'])
def test_a_kill_while_the_summary_is_written_leaves_the_previous_one_whole(
    tmp_path, monkeypatch, where):
  """summary.json was truncated, then rewritten: a kill in between left a torn file."""
  logdir = str(tmp_path / 'run') if where == 'local' else \
      f'ram://seedacme_summary_kill_{uuid.uuid4().hex}'
  writer = ProgressWriter(logdir)
  writer.write_summary({'stopped_because': 'first', 'env_steps': 1})
  _kill_writes_under(monkeypatch, logdir)
  with pytest.raises(_Killed):
    writer.write_summary({'stopped_because': 'second', 'env_steps': 2})
  monkeypatch.undo()
  assert read_summary(logdir)['stopped_because'] == 'first'


def test_a_kill_while_remote_progress_is_written_loses_no_history(monkeypatch):
  """On a remote logdir progress.jsonl was deleted and rewritten in full for every
  record: a kill in between lost the run's whole history."""
  logdir = f'ram://seedacme_progress_kill_{uuid.uuid4().hex}'
  writer = ProgressWriter(logdir)
  for i in range(5):
    writer.write({'elapsed_s': 1.0 * i, 'env_steps': 10 * i})
  _kill_writes_under(monkeypatch, logdir)
  with pytest.raises(_Killed):
    writer.write({'elapsed_s': 5.0, 'env_steps': 50})
  monkeypatch.undo()
  assert [r['env_steps'] for r in read_progress(logdir)] == [0, 10, 20, 30, 40]
  restarted = ProgressWriter(logdir)  # a restarted central node goes on
  restarted.write({'elapsed_s': 0.5, 'env_steps': 55})
  assert [r['env_steps'] for r in read_progress(logdir)] == [0, 10, 20, 30, 40, 55]


class FakeGcs:
  """A file system that behaves like GCS: an object is written whole (it appears at the
  end of its upload, or not at all) and never appended to; rename copies and deletes;
  directories are name prefixes. Counts what is uploaded."""

  def __init__(self):
    self.objects = {}
    self.uploads = []  # (path, bytes) per write
    self.kill_at_upload = None  # the upload that dies before it completes

  def exists(self, path):
    path = path.rstrip('/')
    return path in self.objects or any(k.startswith(path + '/') for k in self.objects)

  def listdir(self, path):
    prefix = path.rstrip('/') + '/'
    return sorted({k[len(prefix):].split('/')[0] for k in self.objects
                   if k.startswith(prefix)})

  def makedirs(self, path):
    del path

  def read(self, path):
    return self.objects[path]

  def size(self, path):
    return len(self.objects[path])

  def write(self, path, data):
    if self.kill_at_upload is not None and len(self.uploads) == self.kill_at_upload:
      raise _Killed()
    self.uploads.append((path, len(data)))
    self.objects[path] = bytes(data)

  def rename(self, src, dst):
    self.objects[dst] = self.objects.pop(src)

  def remove(self, path):
    del self.objects[path]


@pytest.fixture
def gcs():
  fs = FakeGcs()
  logdir_lib.register_filesystem('fakegs://', fs)
  yield fs
  logdir_lib.register_filesystem('fakegs://', None)


def test_remote_progress_is_appended_in_segments_without_rewriting_history(gcs):
  logdir = 'fakegs://bucket/run'
  writer = ProgressWriter(logdir, tensorboard=False)
  n = 3 * logdir_lib.SEGMENT_RECORDS + 5
  for i in range(n):
    writer.write({'elapsed_s': 1.0 * i, 'env_steps': i})
  assert [r['env_steps'] for r in read_progress(logdir)] == list(range(n))
  segments = [p for p in gcs.objects if '/progress.parts/' in p]
  assert len(segments) == 4 and all(not p.split('/')[-1].startswith('.') for p in segments)
  # Each record uploads only its own segment: bounded, not the whole history.
  largest = max(size for path, size in gcs.uploads)
  assert largest <= max(gcs.size(p) for p in segments)
  assert sum(size for _, size in gcs.uploads) < 40 * sum(gcs.size(p) for p in segments)
  # The launcher's tail: byte offsets over the segments give every record once.
  seen, offset = [], 0
  restarted = ProgressWriter(logdir, tensorboard=False)
  for i in range(n, n + 3):
    restarted.log_event(f'event {i}') if i == n else restarted.write({'env_steps': i})
    records, offset = logdir_lib.tail_lines(logdir, offset)
    seen += records
  records, offset = logdir_lib.tail_lines(logdir, offset)
  assert records == []
  all_lines = logdir_lib.tail_lines(logdir)[0]
  assert seen == all_lines and len(seen) == n + 3
  assert [r.get('env_steps') for r in all_lines][-3:] == [None, n + 1, n + 2]
  assert read_events(logdir) == [f'event {n}']


def test_a_kill_mid_upload_on_gcs_loses_at_most_the_record_in_flight(gcs):
  logdir = 'fakegs://bucket/run'
  writer = ProgressWriter(logdir, tensorboard=False)
  for i in range(10):
    writer.write({'env_steps': i})
  writer.write_summary({'stopped_because': 'first'})
  gcs.kill_at_upload = len(gcs.uploads)
  with pytest.raises(_Killed):
    writer.write({'env_steps': 10})
  with pytest.raises(_Killed):
    writer.write_summary({'stopped_because': 'second'})
  gcs.kill_at_upload = None
  assert [r['env_steps'] for r in read_progress(logdir)] == list(range(10))
  assert read_summary(logdir) == {'stopped_because': 'first'}
  ProgressWriter(logdir, tensorboard=False).write({'env_steps': 11})  # the restarted node's first record
  assert [r['env_steps'] for r in read_progress(logdir)] == list(range(10)) + [11]


def test_published_curve_is_the_run_at_fixed_env_step_points():
  """A published JSON's curve: the first record at or past every `every` env steps (as
  the benches read a return at 1M), the refilling window of a resumed segment null."""
  assert [curve_step(n) for n in (1_000_000, 300_000, 5_000_000, 219_232)] == [
      10_000, 5_000, 50_000, 2_500]
  records = [{'elapsed_s': 10.0 * i, 'env_steps': 4_000 * i, 'episodes': 200 * i,
              'average_over': 100, 'average_return': float(i),
              'eval_average_return': None if i < 3 else 10.0 + i} for i in range(1, 6)]
  records.append({'elapsed_s': 5.0, 'env_steps': 24_000, 'episodes': 1_010,
                  'average_over': 10, 'average_return': 9.0, 'eval_average_return': 20.0})
  assert published_curve(records, 10_000) == {
      'env_steps': [10_000, 20_000], 'average_return': [3.0, 5.0],
      'eval_return': [13.0, 15.0]}
  assert published_curve(records, 8_000)['average_return'] == [2.0, 4.0, None]
  assert published_curve([], 1_000) == {'env_steps': [], 'average_return': [],
                                        'eval_return': []}
