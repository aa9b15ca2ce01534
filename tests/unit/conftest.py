"""Fixtures shared by unit tests (pytest finds this file; Bazel ships it with each test)."""

import time

import pytest


def _wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
  """Polls `predicate` until it holds (True) or `timeout_s` passes (False)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(interval_s)
  return False


@pytest.fixture
def wait_until():
  """`wait_until(predicate, timeout_s=30, interval_s=0.05) -> bool`: polls a condition."""
  return _wait_until
