"""seedacme: SEED RL's central-inference architecture on Acme, Reverb and Launchpad.

Importing this package is cheap and quiet: it imports neither TensorFlow nor gym.
It sets the environment variables TensorFlow reads at import time: log levels, so the
first TF import anywhere in the process does not flood the console, and oneDNN on.

Import paths. The repository keeps the product's top-level layout (`seedacme/`,
`agents/`, `envs/`, `launchers/`), but only one name is ever put on `sys.path`:
`seedacme`. The other three are its subpackages:

    seedacme.agents.vtrace      <- agents/vtrace/
    seedacme.envs               <- envs/
    seedacme.launchers.local    <- launchers/local.py

A wheel (`pip install .`) physically places them under `seedacme/` (setuptools
`package_dir`). In a source tree (editable install, Bazel runfiles, running from the
checkout) the `_SourceTreeFinder` below maps the three names onto the sibling
directories, so both ways give identical module names.
"""

import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')
# oneDNN (off by default in TF 2.8 on Linux): the Nature CNN learner step runs 2-3x
# faster with it on 2 cores (bench/learner_speed.py). TF reads it at import; =0 opts out.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1')

__version__ = '0.1.0'

_MAPPED_SUBPACKAGES = ('agents', 'envs', 'launchers')
_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.dirname(_HERE)


class _SourceTreeFinder(importlib.abc.MetaPathFinder):
  """Resolves `seedacme.{agents,envs,launchers}` to the repository's top-level dirs."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    prefix, _, name = fullname.partition('.')
    if prefix != __name__ or name not in _MAPPED_SUBPACKAGES:
      return None
    init = os.path.join(_SOURCE_ROOT, name, '__init__.py')
    if not os.path.isfile(init):
      return None
    return importlib.util.spec_from_file_location(
        fullname, init, submodule_search_locations=[os.path.dirname(init)])


def _install_source_tree_finder() -> None:
  if any(os.path.isdir(os.path.join(_HERE, n)) for n in _MAPPED_SUBPACKAGES):
    return  # Installed from a wheel: the subpackages are physically here.
  if not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
    sys.meta_path.append(_SourceTreeFinder())


_install_source_tree_finder()


def _forbid_sources(dirs: str) -> None:
  """Fails the process at any read of a Python source or library under `dirs`.

  Set by the emulated cluster (`launchers/emulation.py`, env `SEEDACME_FORBIDDEN_SOURCE`,
  os.pathsep-separated) to the checkout's package dirs: a replica must import only from
  its copy of the code, as a container would.
  """
  roots = tuple(os.path.abspath(d) + os.sep for d in dirs.split(os.pathsep) if d)
  if (_HERE + os.sep).startswith(roots):  # this very package came from the checkout
    sys.stderr.write(f'seedacme: imported {_HERE} from the checkout, which a container '
                     f'would not have ({os.getpid()})\n')
    sys.stderr.flush()
    os._exit(3)

  def hook(event, args):
    if event != 'open' or not args or not isinstance(args[0], str):
      return
    path = args[0]
    if path.startswith(roots) and path.endswith(('.py', '.pyc', '.so')):
      sys.stderr.write(f'seedacme: imported {path} from the checkout, which a container '
                       f'would not have ({os.getpid()})\n')
      sys.stderr.flush()
      os._exit(3)

  sys.addaudithook(hook)


if os.environ.get('SEEDACME_FORBIDDEN_SOURCE'):
  _forbid_sources(os.environ['SEEDACME_FORBIDDEN_SOURCE'])
