"""Integration tests' shared guard (no program outlives the test that launched it) and
their schedule two at a time (`scripts/test`: pytest-xdist `-n 2`;
`SEEDACME_INTEGRATION_WORKERS=1` runs one at a time).

A program here leaves a third to a half of the 2 cores idle (actors wait on inference,
nodes wait on ports, tests poll and wait out partitions): `scripts/test` on a fresh
clone used 1.18 cores of 2 (user+sys 16.2 min in 13.8 min of wall, 2026-11-28). Two at
a time, the emulated clusters (hosts, Vertex, Slurm: several programs each) run one
after another on one worker, and the longest tests are handed out first, so the last to
finish is not a long one started late. A neighbour's load once failed two tests here;
both were product bugs, since fixed (docs/testing.md)."""

import pytest

from tests.integration import launch

# Files whose tests start emulated clusters of several hosts: one worker, in turn.
_CLUSTER_FILES = ('test_emulated_cluster.py', 'test_slurm.py', 'test_vertex_emulation.py',
                  'test_tls_flood.py', 'test_reproducible_hosts.py')


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """The clusters first, then the long tier, then the rest; in file order within each."""
  def rank(item):
    if item.path.name in _CLUSTER_FILES:
      return 0
    return 1 if item.get_closest_marker('long') else 2
  items.sort(key=rank)


def pytest_xdist_make_scheduler(config, log):
  """`--dist loadgroup`: every other test its own unit of work, the cluster files' tests
  one unit. (xdist 3.8's own groups, `@pytest.mark.xdist_group`, do nothing under
  pytest 9: it renames the group into `item._nodeid`, which pytest 9 no longer reads, so
  the clusters ran side by side.)"""
  if config.getvalue('dist') != 'loadgroup':
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  class ClustersInTurn(LoadScopeScheduling):

    def _split_scope(self, nodeid: str) -> str:
      name = nodeid.split('::', 1)[0].rsplit('/', 1)[-1]
      return 'clusters' if name in _CLUSTER_FILES else nodeid

  return ClustersInTurn(config, log)


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
