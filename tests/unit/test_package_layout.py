"""The package layout: one top-level import name, `seedacme`, over four source trees.

seedacme/__init__.py maps seedacme.{agents,envs,launchers} onto the repository's
top-level agents/, envs/ and launchers/ directories. These checks hold both under a
plain `pytest` from the checkout and under `bazel test` (runfiles tree), so they only
compare paths relative to wherever `seedacme` itself was imported from.
"""

import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

import seedacme

MAPPED = ('agents', 'envs', 'launchers')
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(seedacme.__file__)))


def _run_fresh(code, cwd):
  """Runs `code` in a new interpreter whose path has seedacme's parent directory."""
  env = dict(os.environ, PYTHONPATH=SOURCE_ROOT, PYTHONNOUSERSITE='1')
  for var in ('PYTHONSTARTUP', 'TF_CPP_MIN_LOG_LEVEL', 'GRPC_VERBOSITY'):
    env.pop(var, None)
  result = subprocess.run(
      [sys.executable, '-c', code], cwd=cwd, env=env, capture_output=True, text=True,
      timeout=120, check=False)
  assert result.returncode == 0, result.stderr
  return result.stdout


def test_seedacme_is_a_regular_package_at_the_source_root():
  assert os.path.basename(os.path.dirname(os.path.abspath(seedacme.__file__))) == 'seedacme'
  assert os.path.isfile(os.path.join(SOURCE_ROOT, 'seedacme', '__init__.py'))
  assert isinstance(seedacme.__version__, str) and seedacme.__version__


@pytest.mark.parametrize('name', MAPPED)
def test_subpackage_maps_to_top_level_directory(name):
  module = importlib.import_module(f'seedacme.{name}')
  assert module.__name__ == f'seedacme.{name}'
  expected_dir = os.path.join(SOURCE_ROOT, name)
  assert os.path.abspath(module.__file__) == os.path.join(expected_dir, '__init__.py')
  assert [os.path.abspath(p) for p in module.__path__] == [expected_dir]


def test_nested_subpackage_resolves_under_mapped_directory():
  # find_spec locates seedacme.agents.vtrace without running its (heavier) __init__.
  spec = importlib.util.find_spec('seedacme.agents.vtrace')
  assert spec is not None
  assert os.path.abspath(spec.origin) == os.path.join(
      SOURCE_ROOT, 'agents', 'vtrace', '__init__.py')


def test_subpackages_are_not_copies_inside_seedacme():
  # The source tree holds them only at the top level; a wheel places them under seedacme/.
  for name in MAPPED:
    assert not os.path.exists(os.path.join(SOURCE_ROOT, 'seedacme', name))


def test_mapping_does_not_alias_bare_top_level_names(tmp_path):
  # Importing through seedacme must not also register `agents`, `envs`, `launchers`
  # as top-level modules: each module is loaded once, under its seedacme.* name.
  out = _run_fresh(
      'import sys\n'
      'import seedacme.agents, seedacme.envs, seedacme.launchers\n'
      f'bare = sorted(m for m in sys.modules if m.split(".")[0] in {MAPPED!r})\n'
      'print(",".join(bare))\n', tmp_path)
  assert out.strip() == ''


def test_importing_seedacme_is_cheap(tmp_path):
  out = _run_fresh(
      'import sys\n'
      'import seedacme\n'
      'heavy = ("tensorflow", "gym", "gymnasium")\n'
      'print(",".join(sorted({m.split(".")[0] for m in sys.modules} & set(heavy))))\n'
      'import os\n'
      'print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"))\n', tmp_path)
  heavy, tf_log_level = out.splitlines()
  assert heavy == ''
  assert tf_log_level == '2'


def test_mapped_names_resolve_in_a_fresh_interpreter(tmp_path):
  out = _run_fresh(
      'import importlib.util\n'
      'for n in ("seedacme.agents", "seedacme.agents.vtrace", "seedacme.envs", '
      '"seedacme.launchers"):\n'
      '  print(importlib.util.find_spec(n).origin)\n', tmp_path)
  expected = [os.path.join(SOURCE_ROOT, 'agents', '__init__.py'),
              os.path.join(SOURCE_ROOT, 'agents', 'vtrace', '__init__.py'),
              os.path.join(SOURCE_ROOT, 'envs', '__init__.py'),
              os.path.join(SOURCE_ROOT, 'launchers', '__init__.py')]
  assert out.splitlines() == expected


def test_the_forbidden_source_guard_stops_an_import_from_the_checkout():
  # What the emulated Vertex cluster relies on to prove its replicas import only copies.
  root = os.path.dirname(os.path.dirname(os.path.abspath(seedacme.__file__)))
  for forbidden, statement in ((os.path.join(root, 'seedacme'), 'import seedacme'),
                               (os.path.join(root, 'agents'), 'import seedacme.agents.vtrace')):
    done = subprocess.run([sys.executable, '-c', statement], capture_output=True, text=True,
                          env=dict(os.environ, SEEDACME_FORBIDDEN_SOURCE=forbidden), timeout=60)
    assert done.returncode == 3 and 'from the checkout' in done.stderr, done.stderr[-500:]
  done = subprocess.run([sys.executable, '-c', 'import seedacme.agents.vtrace'], timeout=60,
                        env=dict(os.environ, SEEDACME_FORBIDDEN_SOURCE='/nonexistent'))
  assert done.returncode == 0


def test_no_test_imports_a_private_name_of_the_package():
  """Tests use the package's public interfaces (names without a leading underscore)."""
  import ast  # pylint: disable=g-import-not-at-top
  tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  private = []
  for root, _, files in os.walk(tests):
    for name in files:
      if not name.endswith('.py'):
        continue
      path = os.path.join(root, name)
      for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('seedacme'):
          private += [f'{path}: {a.name}' for a in node.names if a.name.startswith('_')]
  assert not private, private
