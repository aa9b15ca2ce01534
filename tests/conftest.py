"""The suite's tiers: `@pytest.mark.long('why')` tests run only with `--all`.

`scripts/test` (and plain `pytest`, and each Bazel target) runs the default tier: every
unit test and every integration test but the long ones; `scripts/test --all` (what CI
runs) adds them. A test goes to the long tier only with its reason in the marker --
`@pytest.mark.long('learns Pong to 18: 40 min')` -- and collection fails without one,
so the tier stays a list of reasons, not a place tests disappear to (docs/testing.md).
`SEEDACME_TEST_ALL=1` is `--all` for runners that cannot pass flags (Bazel:
`scripts/bazel_test --all`).

What a test needs of the host, as markers (issue 64: the suite passes on a host without
user namespaces, `scripts/without_namespaces scripts/test`): `@pytest.mark.needs_namespaces`
(a private user+network namespace with `lo` up: `unshare -rn`, `ip netns`, nsenter)
and `@pytest.mark.needs_other_uid` (root running a command as uid 65534 through
`setpriv --reuid`, or chowning a file to it: CAP_SETUID and a mapped uid). Where the
host lacks it the test skips naming why; where the run requires namespaces
(`SEEDACME_REQUIRE_NAMESPACES=1`, as CI sets on its normal host) it fails instead, so
a passing CI run is one where they ran. Not being root is a property of the account,
not of the host: `needs_other_uid` skips then, required or not. A test that checks
another uid as one part of a longer run asks the `other_uid_problem` fixture.
"""

import functools
import os
import shutil
import subprocess

import pytest

from tests import emulated_hosts

OTHER_UID = 65534  # nobody: the "other local user" of the tests

_LONG_DESELECTED = pytest.StashKey[int]()


def pytest_addoption(parser):
  parser.addoption('--all', action='store_true', dest='seedacme_all',
                   help='seedacme: run the long tier too (tests marked long)')


def pytest_configure(config):
  config.addinivalue_line('markers', 'long(reason): only with --all; the reason is required')
  config.addinivalue_line('markers', 'needs_namespaces: skips (naming why) on a host '
                          'without user+network namespaces, fails there if '
                          'SEEDACME_REQUIRE_NAMESPACES=1')
  config.addinivalue_line('markers', 'needs_other_uid: skips (naming why) where root '
                          'cannot become uid 65534, fails there if '
                          'SEEDACME_REQUIRE_NAMESPACES=1')


def run_all(config) -> bool:
  return bool(config.getoption('seedacme_all') or os.environ.get('SEEDACME_TEST_ALL'))


def pytest_collection_modifyitems(config, items):
  unexplained = [item.nodeid for item in items
                 if (m := item.get_closest_marker('long')) is not None
                 and not (m.args and isinstance(m.args[0], str) and m.args[0].strip())]
  if unexplained:
    raise pytest.UsageError('@pytest.mark.long needs its reason as the first argument: '
                            + ', '.join(unexplained))
  if not run_all(config):
    keep, long_ = [], []
    for item in items:
      (long_ if item.get_closest_marker('long') else keep).append(item)
    if long_:
      config.hook.pytest_deselected(items=long_)
      items[:] = keep
      config.stash[_LONG_DESELECTED] = len(long_)
  _skip_what_this_host_lacks(items)


def pytest_sessionfinish(session, exitstatus):
  # A file whose tests are all long (a Bazel target, `scripts/test FILE`) ran nothing by
  # choice: that is a pass, not pytest's "no tests collected" (exit 5).
  if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and \
      session.config.stash.get(_LONG_DESELECTED, 0):
    session.exitstatus = pytest.ExitCode.OK


@functools.cache
def _namespace_problem() -> str | None:
  """Why this host gives no private user+network namespace (None: it does): the
  launcher's own probe (`unshare -rn`, then `lo` up)."""
  from seedacme.runtime import isolation  # pylint: disable=g-import-not-at-top
  return isolation.namespace_problem()


@functools.cache
def _other_uid_problem() -> str | None:
  """Why this process cannot act as another local user, uid 65534 (None: it can).
  Probed by doing it: inside a user namespace that maps only root, or without
  CAP_SETUID (a container, `scripts/without_namespaces`), root's `setpriv` fails."""
  if os.geteuid() != 0:
    return f'acting as another uid ({OTHER_UID}, through setpriv) needs root'
  if shutil.which('setpriv') is None:
    return 'setpriv (util-linux) is not installed'
  try:
    probe = subprocess.run(['setpriv', f'--reuid={OTHER_UID}', f'--regid={OTHER_UID}',
                            '--clear-groups', 'true'], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired:
    return f'setpriv --reuid={OTHER_UID} did not finish in 30 s'
  if probe.returncode != 0:
    return (f'root here cannot become uid {OTHER_UID} (no CAP_SETUID, or the uid is not '
            f'mapped in this user namespace): {" ".join(probe.stderr.split())}')
  return None


_NEEDS = (('needs_namespaces', 'needs user+network namespaces'),
          ('needs_other_uid', f'needs to act as another uid ({OTHER_UID})'))


def _lacks(marker: str) -> tuple:
  """(why the host lacks what `marker` needs, or None; whether the run requires it)."""
  if marker == 'needs_namespaces':
    return _namespace_problem(), emulated_hosts.namespaces_required()
  return _other_uid_problem(), emulated_hosts.namespaces_required() and os.geteuid() == 0


def _skip_what_this_host_lacks(items):
  """Marks skipped, with the reason, each test needing what this host lacks (a skip
  mark: `-rs` names the test's own line); left to fail at set-up where required."""
  for item in items:
    for marker, what in _NEEDS:
      if item.get_closest_marker(marker) is not None:
        why, required = _lacks(marker)
        if why is not None and not required:
          item.add_marker(pytest.mark.skip(reason=f'{what}: {why}'))
          break


def _fail_if_required(marker: str) -> str | None:
  """Why the host lacks what `marker` needs (None: it has it); fails the test instead
  where the run requires it (`SEEDACME_REQUIRE_NAMESPACES=1`, root for another uid)."""
  why, required = _lacks(marker)
  if why is not None and required:
    pytest.fail(f'{emulated_hosts.REQUIRE_VAR}=1 but this test is marked {marker}: '
                f'{why}', pytrace=False)
  return why


def pytest_runtest_setup(item):
  for marker, _ in _NEEDS:
    if item.get_closest_marker(marker) is not None:
      _fail_if_required(marker)


@pytest.fixture
def other_uid_problem():
  """Why this process cannot act as uid 65534 (None: it can), for a test that checks
  another uid as one part of a longer run; fails the test where that is required."""
  return _fail_if_required('needs_other_uid')
