"""Integration tests' shared guard (no program outlives the test that launched it) and
their schedule for two at a time (`scripts/test`: pytest-xdist, `--dist loadgroup`).

A program here leaves a third to a half of the 2 cores idle (actors wait on inference,
nodes wait on ports, tests poll and wait out partitions): `scripts/test` on a fresh
clone used 1.07 cores of 2 (user+sys 16.2 min in 13.8 min of wall, 2026-11-28), so two
tests run at once. The emulated clusters (hosts, Vertex, Slurm: several programs each)
run one after another on one worker, and the longest tests are handed out first, so
the last to finish is not a long one started late.
"""

import pytest

from tests.integration import launch

# Files whose tests start emulated clusters of several hosts: one worker, in turn.
_CLUSTER_FILES = ('test_emulated_cluster.py', 'test_slurm.py', 'test_vertex_emulation.py')


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the group markers
def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """The clusters first (one group), then the long tier, then the rest; in order."""
  def rank(item):
    if item.path.name in _CLUSTER_FILES:
      return 0
    return 1 if item.get_closest_marker('long') else 2
  for item in items:
    if item.path.name in _CLUSTER_FILES:
      item.add_marker(pytest.mark.xdist_group('clusters'))
  items.sort(key=rank)  # stable: file order within a rank


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
