"""The suite's tiers: `@pytest.mark.long('why')` tests run only with `--all`.

`scripts/test` (and plain `pytest`, and each Bazel target) runs the default tier: every
unit test and every integration test but the long ones; `scripts/test --all` (what CI
runs) adds them. A test goes to the long tier only with its reason in the marker --
`@pytest.mark.long('learns Pong to 18: 40 min')` -- and collection fails without one,
so the tier stays a list of reasons, not a place tests disappear to (docs/testing.md).
`SEEDACME_TEST_ALL=1` is `--all` for runners that cannot pass flags (Bazel:
`scripts/bazel_test --all`).
"""

import os

import pytest

_LONG_DESELECTED = pytest.StashKey[int]()


def pytest_addoption(parser):
  parser.addoption('--all', action='store_true', dest='seedacme_all',
                   help='seedacme: run the long tier too (tests marked long)')


def pytest_configure(config):
  config.addinivalue_line('markers', 'long(reason): only with --all; the reason is required')


def run_all(config) -> bool:
  return bool(config.getoption('seedacme_all') or os.environ.get('SEEDACME_TEST_ALL'))


def pytest_collection_modifyitems(config, items):
  unexplained = [item.nodeid for item in items
                 if (m := item.get_closest_marker('long')) is not None
                 and not (m.args and isinstance(m.args[0], str) and m.args[0].strip())]
  if unexplained:
    raise pytest.UsageError('@pytest.mark.long needs its reason as the first argument: '
                            + ', '.join(unexplained))
  if run_all(config):
    return
  keep, long_ = [], []
  for item in items:
    (long_ if item.get_closest_marker('long') else keep).append(item)
  if long_:
    config.hook.pytest_deselected(items=long_)
    items[:] = keep
    config.stash[_LONG_DESELECTED] = len(long_)


def pytest_sessionfinish(session, exitstatus):
  # A file whose tests are all long (a Bazel target, `scripts/test FILE`) ran nothing by
  # choice: that is a pass, not pytest's "no tests collected" (exit 5).
  if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and \
      session.config.stash.get(_LONG_DESELECTED, 0):
    session.exitstatus = pytest.ExitCode.OK
