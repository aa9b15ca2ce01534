"""Imports a `bench/` script as a module for the unit tests that check its figures.

Bazel ships the scripts a test needs with the unit tests (BUILD, `unit_test_support`); in
a tree without the script, the calling test module is skipped.
"""

import importlib.util
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), 'bench')


def load(name: str):
  """`bench/<name>.py` as a module (it imports `harness` as a sibling)."""
  path = os.path.join(BENCH, f'{name}.py')
  if not os.path.isfile(path):
    pytest.skip(f'bench/{name}.py is not in this tree', allow_module_level=True)
  if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
  spec = importlib.util.spec_from_file_location(f'seedacme_bench_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
