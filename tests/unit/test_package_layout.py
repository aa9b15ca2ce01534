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


# ---- The core's shape: subpackages in the order of the data flow ----------------------
# A module may import from its own subpackage and from any of lower rank, never upward
# (README, "Where things are"). `seedacme.agents`, `.envs` and `.launchers` build on the
# core; the core never imports them.
CORE_RANKS = {
    'types': 0, 'runtime': 0, 'lazy': 0,
    'config': 1, 'wire': 1,
    'run': 2,
    'serving': 3, 'trajectories': 3, 'learner': 3, 'networks': 3,
    'distributions': 3, 'normalization': 3,
    'builder': 4,
    'actor': 5,
    'nodes': 6,
}
OUTSIDE_THE_CORE = ('agents', 'envs', 'launchers')
# Modules over this many lines say at their top why they are that long.
LONG_MODULE_LINES = 300
CORE_DIR = os.path.dirname(os.path.abspath(seedacme.__file__))


def _core_modules():
  for root, _, files in os.walk(CORE_DIR):
    for name in files:
      if name.endswith('.py') and name != '__init__.py':
        path = os.path.join(root, name)
        yield os.path.relpath(path, CORE_DIR)[:-3].split(os.sep), path


def _seedacme_imports(path):
  """Every `seedacme.<part>` a module imports (at any depth: lazy imports count)."""
  import ast  # pylint: disable=g-import-not-at-top
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] if node.module != 'seedacme' else \
          [f'seedacme.{a.name}' for a in node.names]
    elif isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    found.update(n.split('.')[1] for n in names
                 if n.startswith('seedacme.') and len(n.split('.')) > 1)
  return found


def test_the_core_imports_only_downward_and_never_agents_envs_or_launchers():
  wrong = []
  for parts, path in _core_modules():
    part = parts[0]
    assert part in CORE_RANKS, f'{path}: add {part!r} to CORE_RANKS (and the README map)'
    for target in _seedacme_imports(path):
      if target in OUTSIDE_THE_CORE:
        wrong.append(f'{"/".join(parts)} imports seedacme.{target}')
      elif target != part and CORE_RANKS.get(target, 99) >= CORE_RANKS[part]:
        wrong.append(f'{"/".join(parts)} (rank {CORE_RANKS[part]}) imports seedacme.'
                     f'{target} (rank {CORE_RANKS.get(target)})')
  assert not wrong, wrong


def test_the_central_node_does_not_depend_on_the_actor_side():
  assert 'actor' not in _seedacme_imports(os.path.join(CORE_DIR, 'nodes', 'central.py'))


def test_long_core_modules_say_why_at_their_top():
  import ast  # pylint: disable=g-import-not-at-top
  unexplained = []
  for parts, path in _core_modules():
    source = open(path).read()
    if source.count('\n') > LONG_MODULE_LINES:
      doc = ast.get_docstring(ast.parse(source)) or ''
      if 'lines' not in doc:  # e.g. "Why N lines: ..."
        unexplained.append('/'.join(parts))
  assert not unexplained, f'over {LONG_MODULE_LINES} lines without a reason: {unexplained}'


def _private_uses(path):
  """Private names of the package that `path` reads: imports, attribute reads of a
  seedacme module or of a name imported from one, and `monkeypatch.setattr` targets."""
  import ast  # pylint: disable=g-import-not-at-top
  tree_ = ast.parse(open(path).read())
  package_names = set()  # local names bound to seedacme modules or objects
  found = []
  for node in ast.walk(tree_):
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('seedacme'):
      for a in node.names:
        package_names.add(a.asname or a.name)
        if a.name.startswith('_'):
          found.append(f'imports {a.name}')
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.startswith('seedacme'):
          package_names.add(a.asname or a.name.split('.')[0])
  for node in ast.walk(tree_):
    if isinstance(node, ast.Attribute) and node.attr.startswith('_') and \
        not node.attr.startswith('__'):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id in package_names:
        found.append(f'reads {ast.unparse(node)}')
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in ('setattr', 'delattr') and \
        isinstance(node.func.value, ast.Name) and node.func.value.id == 'monkeypatch':
      args = node.args
      if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        target = args[0].value  # 'module.path.name'
        if target.startswith('seedacme') and target.rsplit('.', 1)[-1].startswith('_'):
          found.append(f'monkeypatches {target}')
      elif len(args) >= 2 and isinstance(args[1], ast.Constant) and \
          str(args[1].value).startswith('_') and not str(args[1].value).startswith('__'):
        base = args[0]
        while isinstance(base, ast.Attribute):
          base = base.value
        # The package's own objects only: a third-party module's private hook (e.g.
        # Launchpad's signal table, held so a test is not signalled) is not a seam of ours.
        if isinstance(base, ast.Name) and base.id in package_names:
          found.append(f'monkeypatches {ast.unparse(args[0])}.{args[1].value}')
  return found


def test_tests_and_benches_use_only_public_names_of_the_package():
  """Tests and benches go through the package's public seams: no private name of it
  is imported, read or monkeypatched (a refactor must not have to edit them)."""
  root = os.path.dirname(CORE_DIR)
  private = []
  for top in ('tests', 'bench'):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(dirpath, name)
          private += [f'{os.path.relpath(path, root)}: {u}' for u in _private_uses(path)]
  assert not private, private


def test_every_core_subpackage_is_a_regular_package():
  """setup.py ships what `setuptools.find_packages` finds, and it skips a folder without
  `__init__.py`: the wheel (and Vertex's images) would lack that part of the core."""
  missing = [os.path.relpath(root, CORE_DIR) for root, _, files in os.walk(CORE_DIR)
             if '__pycache__' not in root and any(f.endswith('.py') for f in files)
             and '__init__.py' not in files]
  assert not missing, missing
