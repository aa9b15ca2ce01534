"""The published results stay data, not run dumps (issue 50, item 1).

A clone once weighed 118 MB, most of it kept runs under bench/published (40 MB R2D2
checkpoints, TensorBoard events, every seed's progress.jsonl). A published result is
one JSON (command, commit, config, machine and load, per-seed curves at fixed env-step
points, final figures) and one picture; a run still to be resumed is kept outside the
checkout (bench/keep_run.py). These tests keep it so: every git-tracked file under
bench/ below 1 MB, the tracked bench/published below 10 MB in all, no curve CSV beside a
published JSON (its curves are in the JSON), and the learning results' `seed_curves`
in the form their readers expect.

They count what git tracks (`git ls-files`), not what lies in the working tree (a run's
output under bench/results is ignored by git). Bazel runs unit tests in a runfiles tree
without .git: there the tracked-file checks skip, saying so.
"""

import glob
import json
import os
import shutil
import subprocess
from typing import Dict

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLISHED = os.path.join(REPO, 'bench', 'published')
MAX_FILE_BYTES = 1_000_000  # any tracked file under bench/
MAX_PUBLISHED_BYTES = 10_000_000  # the tracked bench/published in all


def _tracked(folder: str) -> Dict[str, int]:
  """Tracked files under `folder` (repo-relative) with their sizes in the working tree."""
  if not os.path.exists(os.path.join(REPO, '.git')) or shutil.which('git') is None:
    pytest.skip('not a git checkout (e.g. Bazel runfiles): the tracked files are unknown')
  out = subprocess.run(['git', 'ls-files', '-z', '--', folder], cwd=REPO, check=True,
                       capture_output=True).stdout.decode()
  paths = [p for p in out.split('\0') if p]
  # A tracked file removed from the working tree (staged for deletion) weighs nothing.
  return {p: os.path.getsize(os.path.join(REPO, p)) for p in paths
          if os.path.isfile(os.path.join(REPO, p))}


def test_every_tracked_file_under_bench_is_below_1_mb():
  big = {p: n for p, n in _tracked('bench').items() if n >= MAX_FILE_BYTES}
  assert not big, (f'tracked files of 1 MB or more under bench/: {big}; a run dump '
                   'belongs outside the checkout (bench/keep_run.py), a result in its JSON')


def test_tracked_published_results_are_below_10_mb():
  files = _tracked('bench/published')
  total = sum(files.values())
  largest = sorted(files.items(), key=lambda kv: -kv[1])[:5]
  assert total < MAX_PUBLISHED_BYTES, (f'bench/published holds {total / 1e6:.1f} MB '
                                       f'tracked; largest: {largest}')


def test_no_curve_csv_beside_the_published_jsons():
  """Per-seed curves are in the JSON (`seed_curves`); a CSV beside it would be a second
  copy that readers could disagree on."""
  csvs = sorted(os.path.relpath(p, REPO) for p in glob.glob(
      os.path.join(PUBLISHED, '**', '*.csv'), recursive=True))
  assert not csvs, f'fold these into their JSONs (seed_curves): {csvs}'


def _learning_results():
  """The published JSONs that hold learning curves (their `seed_curves`)."""
  for path in sorted(glob.glob(os.path.join(PUBLISHED, '**', '*.json'), recursive=True)):
    with open(path) as f:
      result = json.load(f)
    if 'seed_curves' in result:
      yield os.path.relpath(path, REPO), result


def test_seed_curves_are_runs_at_fixed_env_step_points():
  results = dict(_learning_results())
  if not results:
    pytest.skip('no published learning results in this tree')
  for known in ('mujoco_learning_sac.json', 'pong_learning_r2d2_b8.json',
                'football_learning.json'):
    if os.path.isfile(os.path.join(PUBLISHED, known)):
      assert f'bench/published/{known}' in results, known
  in_checkout = os.path.exists(os.path.join(REPO, '.git'))  # Bazel ships no PNGs
  for path, result in results.items():
    curves = result['seed_curves']
    every = curves['every_env_steps']
    assert every > 0 and curves['runs'], path
    for run in curves['runs']:
      assert {'name', 'task', 'agent', 'seed'} <= set(run), (path, run.keys())
      steps = run['env_steps']
      assert steps == list(range(every, every * (len(steps) + 1), every)), (path, run['name'])
      assert len(run['average_return']) == len(run['eval_return']) == len(steps), path
      assert len(steps) <= 110, (path, run['name'], len(steps))
    picture = result.get('provenance', {}).get('picture')
    if picture and in_checkout:
      assert os.path.isfile(os.path.join(REPO, picture)), (path, picture)
