"""Each Bazel unit-test target ships what its test file needs: a static check of `BUILD`.

Bazel runs a unit test in its own runfiles tree: its own `test_*.py`, the `:seedacme`
library and the `unit_test_support` filegroup, nothing else of the checkout. A test that
imports another test file, or a helper or bench script outside that group, passes under
pytest and fails (or, through `bench_modules.load`, skips) under Bazel: CI's run of
2026-11-28 failed so (test_courier_attacks imported test_courier_fuzz).
`scripts/bazel_test --collect` finds an import missing from a target by building every
target and collecting each file in its runfiles (265 s here). This finds the same from
BUILD and the import statements of the test files, their conftests and the helpers they
reach, in about a second, so the suite (and CI) runs this one; run the collect after
changing BUILD itself. It also finds a `load('<script>')` of a bench script missing from
the group, which the collect does not (the test would skip there).
"""

import ast
import functools
import glob
import os
from typing import Dict, FrozenSet, Iterable, List, Set

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Top-level names that are this checkout's code; other imports come from the venv.
LOCAL = ('tests', 'bench', 'seedacme', 'agents', 'envs', 'launchers')
LIBRARY = ('seedacme', 'agents', 'envs', 'launchers')  # all of :seedacme's .py files

pytestmark = pytest.mark.skipif(
    'TEST_SRCDIR' in os.environ or not os.path.isfile(os.path.join(REPO, 'BUILD')),
    reason="checks the checkout's BUILD against its test files; under Bazel the "
           'runfiles tree is the thing checked')


def _call(node: ast.AST, name: str) -> bool:
  return isinstance(node, ast.Call) and getattr(node.func, 'id', None) == name


def _glob(call: ast.Call) -> Set[str]:
  """A literal `glob([...], exclude=[...])` of BUILD, evaluated against the checkout."""
  include = ast.literal_eval(call.args[0])
  exclude = next((ast.literal_eval(k.value) for k in call.keywords if k.arg == 'exclude'),
                 [])
  def expand(patterns):
    return {os.path.relpath(p, REPO) for pattern in patterns
            for p in glob.glob(os.path.join(REPO, pattern), recursive=True)
            if os.path.isfile(p)}
  return expand(include) - expand(exclude)


def unit_test_support(build_text: str) -> Set[str]:
  """The files of BUILD's `unit_test_support` filegroup (paths from the checkout)."""
  tree = ast.parse(build_text, 'BUILD')  # Starlark's syntax here is Python's
  for node in ast.walk(tree):
    if _call(node, 'filegroup') and any(
        k.arg == 'name' and ast.literal_eval(k.value) == 'unit_test_support'
        for k in node.keywords):
      srcs = next(k.value for k in node.keywords if k.arg == 'srcs')
      files = set()
      for part in ([srcs.left, srcs.right] if isinstance(srcs, ast.BinOp) else [srcs]):
        files |= _glob(part) if _call(part, 'glob') else set(ast.literal_eval(part))
      return files
  raise AssertionError('BUILD has no filegroup named unit_test_support')


def _module_files(name: str) -> List[str]:
  """The checkout's files a dotted import of `name` executes (packages' __init__ too)."""
  parts, files = name.split('.'), []
  for i in range(1, len(parts) + 1):
    base = os.path.join(*parts[:i])
    for candidate in (base + '.py', os.path.join(base, '__init__.py')):
      if os.path.isfile(os.path.join(REPO, candidate)):
        files.append(candidate)
  return files


@functools.cache
def needed(path: str) -> FrozenSet[str]:
  """Local files `path` imports (anywhere in it: a test's imports run when it runs),
  and the bench scripts it loads through `tests/unit/bench_modules.load('<name>')`."""
  with open(os.path.join(REPO, path)) as f:
    tree = ast.parse(f.read(), path)
  package = os.path.dirname(path).replace(os.sep, '.')
  out = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        up = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join(up + ([base] if base else []))
      names = [base] + [f'{base}.{a.name}' for a in node.names]
    elif (_call(node, 'load') and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)):
      out.add(f'bench/{node.args[0].value}.py')
    for name in names:
      if name.split('.')[0] in LOCAL:
        out.update(_module_files(name))
  return frozenset(out)


def missing(test: str, available: Set[str], start: Iterable[str] = ()) -> Dict[str, str]:
  """{file: who needs it} for every local file `test` reaches (through its imports and
  those of the conftests and helpers it reaches) that is not in `available`."""
  todo = [(test, None)] + [(s, test) for s in start]
  seen, out = set(), {}
  while todo:
    path, by = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    if path.startswith(tuple(p + '/' for p in LIBRARY)):
      continue  # :seedacme ships all of them, and they import no test or bench file
    if path not in available:
      out[path] = by
      continue  # its own imports are reported once it is shipped
    if path.endswith('.py') and os.path.isfile(os.path.join(REPO, path)):
      todo.extend((n, path) for n in needed(path))
  return out


def _unit_tests() -> List[str]:
  return sorted(os.path.relpath(p, REPO) for p in glob.glob(
      os.path.join(REPO, 'tests/unit/**/test_*.py'), recursive=True))


def _conftests(test: str) -> List[str]:
  """The conftest.py files pytest loads for `test` (its directory and those above)."""
  out, d = [], os.path.dirname(test)
  while True:
    if os.path.isfile(os.path.join(REPO, d, 'conftest.py')):
      out.append(os.path.join(d, 'conftest.py') if d else 'conftest.py')
    if not d:
      return out
    d = os.path.dirname(d)


def test_every_unit_target_ships_what_its_test_file_imports():
  with open(os.path.join(REPO, 'BUILD')) as f:
    support = unit_test_support(f.read())
  tests = _unit_tests()
  assert len(tests) > 50, tests  # the glob found the suite
  problems = {}
  for test in tests:
    available = support | {test, 'tests/bazel_pytest_main.py'}
    gaps = missing(test, available, _conftests(test))
    if gaps:
      problems[test] = gaps
  assert not problems, (
      'Bazel target(s) would lack files their test needs ({file: needed by}); add the '
      "helper to BUILD's unit_test_support (a helper module, not another test_*.py): "
      f'{problems}')


def test_the_check_finds_a_test_importing_another_test_file_or_an_unshipped_script():
  """The two shapes that fail under Bazel: CI's failure of 2026-11-28 (one test file
  importing another) and a bench script loaded but not shipped."""
  with open(os.path.join(REPO, 'BUILD')) as f:
    support = unit_test_support(f.read())
  assert 'tests/unit/courier_fuzzing.py' in support
  assert not any(os.path.basename(p).startswith('test_') for p in support
                 if p.startswith('tests/unit/'))
  # test_courier_attacks as it was: `from tests.unit import test_courier_fuzz as fuzz`.
  tree = os.path.join('tests', 'unit')
  assert needed(os.path.join(tree, 'test_courier_attacks.py')) >= {
      'tests/unit/courier_fuzzing.py'}
  available = support | {'tests/unit/test_courier_attacks.py'}
  assert missing('tests/unit/test_courier_attacks.py', available) == {}
  assert missing('tests/unit/test_courier_attacks.py', available,
                 ['tests/unit/test_courier_fuzz.py']) == {
                     'tests/unit/test_courier_fuzz.py': 'tests/unit/test_courier_attacks.py'}
  # bench/startup.py loaded by test_startup_marks: shipped, and missing without it.
  startup = 'tests/unit/test_startup_marks.py'
  assert 'bench/startup.py' in needed(startup)
  assert missing(startup, support | {startup}) == {}
  assert 'bench/startup.py' in missing(startup, (support | {startup}) - {'bench/startup.py'})


def long_unit_tests(build_text: str) -> Set[str]:
  """BUILD's `LONG_UNIT_TESTS`: the files that get a `<name>_long` target tagged long."""
  for node in ast.parse(build_text, 'BUILD').body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', '') == 'LONG_UNIT_TESTS':
      return set(ast.literal_eval(node.value))
  raise AssertionError('BUILD has no LONG_UNIT_TESTS list')


def has_long_tests(path: str) -> bool:
  """Whether a test file marks a test (or a parameter, `pytest.param(marks=...)`) long:
  a call of `pytest.mark.long(...)` in its code, not the words in a string."""
  with open(os.path.join(REPO, path)) as f:
    tree = ast.parse(f.read(), path)
  return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == 'long' and isinstance(n.func.value, ast.Attribute)
             and n.func.value.attr == 'mark' for n in ast.walk(tree))


def test_the_long_targets_are_exactly_the_files_with_long_tests():
  """`scripts/bazel_test` runs the default tier by leaving out the targets tagged long;
  a file whose long tests had no `_long` target would never run them under Bazel, and
  a `_long` target of a file without any would run nothing."""
  with open(os.path.join(REPO, 'BUILD')) as f:
    listed = long_unit_tests(f.read())
  marked = {t for t in _unit_tests() if has_long_tests(t)}
  assert marked, 'no unit test file marks a long test: has_long_tests finds none'
  assert listed == marked, (
      f"BUILD's LONG_UNIT_TESTS {sorted(listed)} differ from the unit test files with "
      f'@pytest.mark.long tests {sorted(marked)}: missing {sorted(marked - listed)}, '
      f'not long {sorted(listed - marked)}')
