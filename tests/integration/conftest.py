"""Integration tests' shared guard: no program outlives the test that launched it."""

import pytest

from tests.integration import launch


@pytest.fixture(autouse=True)
def _programs_end_with_their_test():
  """Kills what is left of every `Run` the test launched, whether it failed, was
  interrupted (Ctrl-C on pytest) or forgot one: an interrupted suite left a program
  running until its own time budget. (`Run.complete` still asserts that a program that
  ended by itself left nothing.)"""
  first = len(launch.LAUNCHED)
  yield
  for run in launch.LAUNCHED[first:]:
    if run.proc.poll() is None or launch.leftover_processes(run.tag):
      run.kill()
  del launch.LAUNCHED[first:]
