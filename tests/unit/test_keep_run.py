"""bench/keep_run.py keeps a run's records and newest checkpoint, and the run resumes from it.

A run longer than a session goes on in a later checkout only from what was kept of it,
outside the checkout (`--dest`, $SEEDACME_KEEP_DIR or ~/.cache/seedacme/kept_runs; a
folder inside the checkout is refused); the kept folder must restore the learner exactly
where the newest checkpoint was (weights and counters) and keep the run's saved config
(a resume without it is refused), must not carry older checkpoints, the replay or node
logs, and a resumed run must go on saving into it. Bazel ships bench/keep_run.py with
the unit tests (BUILD, `unit_test_support`); a tree without it skips.
"""

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from seedacme.learner.checkpointing import Checkpointer

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), 'bench', 'keep_run.py')
if not os.path.isfile(_PATH):
  pytest.skip('bench/keep_run.py is not in this tree', allow_module_level=True)
_SPEC = importlib.util.spec_from_file_location('seedacme_bench_keep_run', _PATH)
keep_run = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(keep_run)


IDENTITY = {'agent': 'vtrace', 'agent_config': {'core': 'lstm'}, 'seed': 0}


def _run_logdir(root):
  """A logdir as a run leaves it: records, 3 checkpoints, replay checkpoints, node logs."""
  logdir = root / 'run'
  weights = tf.Variable(np.zeros(5, np.float32))
  ckpt = Checkpointer(str(logdir / 'checkpoints'), {'weights': weights}, identity=IDENTITY)
  for step in (10, 20, 30):
    weights.assign(np.full(5, step, np.float32))
    ckpt.save({'learner_steps': step, 'env_steps': 100 * step, 'episodes': step // 10})
  (logdir / 'progress.jsonl').write_text(json.dumps({'env_steps': 3000}) + '\n')
  (logdir / 'summary.json').write_text(json.dumps({'env_steps': 3000}))
  for folder, name in (('replay', 'table.data'), ('nodes', 'log.txt'),
                       ('tensorboard', 'events.out')):
    (logdir / folder).mkdir()
    (logdir / folder / name).write_text('x' * 10)
  return logdir


def test_kept_run_resumes_from_its_newest_checkpoint(tmp_path):
  logdir, dest = _run_logdir(tmp_path), tmp_path / 'kept'
  copied = keep_run.keep(str(logdir), str(dest), checkpoint=True)
  assert sorted(os.listdir(dest)) == ['checkpoints', 'progress.jsonl', 'summary.json',
                                      'tensorboard']
  assert sorted(os.listdir(dest / 'checkpoints')) == [
      'checkpoint', 'ckpt-3.data-00000-of-00001', 'ckpt-3.index', 'run_config.json']
  assert copied == sum(os.path.getsize(os.path.join(d, f))
                       for d, _, files in os.walk(dest) for f in files
                       if f != 'checkpoint')

  weights = tf.Variable(np.zeros(5, np.float32))
  resumed = Checkpointer(str(dest / 'checkpoints'), {'weights': weights}, identity=IDENTITY)
  assert resumed.restore() == {'learner_steps': 30, 'env_steps': 3000, 'episodes': 3}
  np.testing.assert_array_equal(weights.numpy(), np.full(5, 30, np.float32))
  resumed.save({'learner_steps': 31})  # the resumed run goes on saving there
  assert keep_run.newest_checkpoint(str(dest / 'checkpoints')) == 'ckpt-4'


def test_a_reproducible_runs_round_states_are_kept(tmp_path):
  logdir, dest = _run_logdir(tmp_path), tmp_path / 'kept'
  rounds = logdir / 'checkpoints' / 'rounds'
  rounds.mkdir()
  for name in ('round-50.pkl', 'round-100.pkl', '.round-150.tmp-1234'):
    (rounds / name).write_bytes(b'x' * 7)
  copied = keep_run.keep(str(logdir), str(dest), checkpoint=True)
  assert sorted(os.listdir(dest / 'checkpoints' / 'rounds')) == ['round-100.pkl',
                                                                   'round-50.pkl']
  assert copied == sum(os.path.getsize(os.path.join(d, f))
                       for d, _, files in os.walk(dest) for f in files
                       if f != 'checkpoint')


def test_records_only_without_checkpoint_and_refuses_a_non_run(tmp_path):
  logdir, dest = _run_logdir(tmp_path), tmp_path / 'kept'
  keep_run.keep(str(logdir), str(dest), checkpoint=False)
  assert 'checkpoints' not in os.listdir(dest)
  with pytest.raises(SystemExit, match='no progress.jsonl'):
    keep_run.keep(str(tmp_path / 'kept' / 'tensorboard'), str(tmp_path / 'other'), False)


def test_kept_runs_go_outside_the_checkout(tmp_path, monkeypatch):
  monkeypatch.setenv(keep_run.KEEP_DIR_VAR, str(tmp_path / 'keep'))
  assert keep_run.default_dest('runs/pong_r2d2_b8/') == str(tmp_path / 'keep' / 'pong_r2d2_b8')
  monkeypatch.delenv(keep_run.KEEP_DIR_VAR)
  assert keep_run.default_dest('runs/x').endswith(
      os.path.join('.cache', 'seedacme', 'kept_runs', 'x'))
  (tmp_path / 'repo' / '.git').mkdir(parents=True)
  repo = str(tmp_path / 'repo')
  assert keep_run.inside_checkout(os.path.join(repo, 'bench', 'published', 'runs'), repo)
  assert not keep_run.inside_checkout(str(tmp_path / 'keep' / 'x'), repo)
  assert not keep_run.inside_checkout(str(tmp_path / 'repo2'), repo)
