"""The suite's tiers (tests/conftest.py): a long test runs only with --all, and a long
marker without its reason stops collection, naming the test."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_TESTS = '''
import pytest

def test_default():
  pass

@pytest.mark.long('sleeps for a while')
def test_long():
  pass
'''


def _pytest(tmp_path, body, *args):
  (tmp_path / 'test_tier_probe.py').write_text(body)
  env = {k: v for k, v in os.environ.items() if k != 'SEEDACME_TEST_ALL'}
  env['PYTHONPATH'] = REPO
  return subprocess.run(
      [sys.executable, '-m', 'pytest', '-p', 'tests.conftest', '-p', 'no:cacheprovider',
       '-c', os.devnull, '--rootdir', str(tmp_path), str(tmp_path), *args],
      capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))


def test_the_long_tier_runs_only_with_all(tmp_path):
  default = _pytest(tmp_path, _TESTS, '-v')
  assert default.returncode == 0, default.stdout + default.stderr
  assert 'test_default PASSED' in default.stdout and 'test_long' not in default.stdout
  assert '1 deselected' in default.stdout
  everything = _pytest(tmp_path, _TESTS, '-v', '--all')
  assert everything.returncode == 0, everything.stdout + everything.stderr
  assert 'test_long PASSED' in everything.stdout


def test_a_long_marker_without_its_reason_is_refused(tmp_path):
  run = _pytest(tmp_path, _TESTS.replace("long('sleeps for a while')", 'long'))
  assert run.returncode != 0
  assert 'needs its reason' in run.stdout + run.stderr
  assert 'test_long' in run.stdout + run.stderr


def test_a_file_of_long_tests_only_passes_by_default(tmp_path):
  only_long = _TESTS.replace('def test_default():\n  pass\n', '')
  run = _pytest(tmp_path, only_long)
  assert run.returncode == 0, run.stdout + run.stderr
  assert '1 deselected' in run.stdout
  empty = _pytest(tmp_path, 'X = 1\n')  # no test at all is still pytest's exit 5
  assert empty.returncode == 5, empty.stdout
