"""Pip-installed CUDA libraries are loaded before TensorFlow looks for them, and only then.

No GPU or CUDA wheel here: a fake `site-packages/nvidia/<lib>/lib/<soname>` layout holds
copies of a small real shared library (numpy's bundled libquadmath), loaded in a
subprocess so this process stays clean.
"""

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading

from seedacme.runtime import cuda_libs


def _small_real_library() -> str:
  """numpy's bundled libquadmath: no dependencies beyond libc, and its SONAME is its
  file name (auditwheel names it so), like the NVIDIA wheels' libraries."""
  numpy_dir = importlib.util.find_spec('numpy').submodule_search_locations[0]
  found = glob.glob(os.path.join(os.path.dirname(numpy_dir), 'numpy.libs', 'libquadmath-*.so*'))
  assert found, 'numpy (requirements/lock.txt) ships libquadmath in numpy.libs'
  return found[0]


def _fake_site(root, libraries, source: str) -> str:
  site = os.path.join(str(root), 'site-packages')
  for directory, soname in libraries:
    lib = os.path.join(site, 'nvidia', directory, 'lib')
    os.makedirs(lib, exist_ok=True)
    shutil.copy(source, os.path.join(lib, soname))
  return site


def _run(code: str, env=None) -> dict:
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        timeout=60, env=env)
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_the_wheels_it_does_nothing(tmp_path, monkeypatch):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  (tmp_path / 'nvidia' / 'cudnn').mkdir(parents=True)  # a package dir, but no library
  assert cuda_libs.find_libraries([str(tmp_path)]) == {}
  assert cuda_libs.preload([str(tmp_path)]) == []
  assert 'XLA_FLAGS' not in os.environ


def test_every_library_tensorflow_needs_is_loaded_by_full_path_in_order(tmp_path):
  site = _fake_site(tmp_path, cuda_libs.CUDA_LIBRARIES, _small_real_library())
  os.makedirs(os.path.join(site, 'nvidia', 'cuda_nvcc', 'nvvm', 'libdevice'))
  env = dict(os.environ, XLA_FLAGS='--xla_dump_to=/tmp/x')
  got = _run(f'''
import json, os
from seedacme.runtime import cuda_libs

first = cuda_libs.preload([{site!r}])
again = cuda_libs.preload([{site!r}])
maps = sorted({{line.split()[-1] for line in open('/proc/self/maps') if {site!r} in line}})
print(json.dumps(dict(first=first, again=again, maps=maps, xla=os.environ['XLA_FLAGS'])))
''', env)
  expected = [os.path.join(site, 'nvidia', d, 'lib', s) for d, s in cuda_libs.CUDA_LIBRARIES]
  assert got['first'] == expected and got['again'] == expected
  assert got['maps'] == sorted(expected)  # each one mapped into the process
  nvcc = os.path.join(site, 'nvidia', 'cuda_nvcc')
  assert got['xla'] == f'--xla_dump_to=/tmp/x --xla_gpu_cuda_data_dir={nvcc}'


def test_a_later_dlopen_by_soname_finds_the_preloaded_library(tmp_path):
  # What TensorFlow does: dlopen("libcudnn.so.8", RTLD_NOW | RTLD_LOCAL), no path.
  source = _small_real_library()
  soname = os.path.basename(source)
  site = _fake_site(tmp_path, [('quadmath', soname)], source)
  got = _run(f'''
import ctypes, json, os
from seedacme.runtime import cuda_libs


def dlopen():
  try:
    ctypes.CDLL({soname!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    return True
  except OSError:
    return False
before = dlopen()
loaded = cuda_libs.preload([{site!r}], libraries=[('quadmath', {soname!r})])
print(json.dumps(dict(before=before, loaded=loaded, after=dlopen())))
''')
  assert got == {'before': False, 'after': True,
                 'loaded': [os.path.join(site, 'nvidia', 'quadmath', 'lib', soname)]}


def test_the_central_child_process_starts_without_tensorflow(tmp_path):
  # serve_central preloads first thing; that is early enough only if the supervised
  # child's own start (imports, unpickling its target) has not imported TensorFlow.
  from seedacme.runtime.supervisor import Supervisor  # pylint: disable=g-import-not-at-top
  report = str(tmp_path / 'modules.json')

  def target(stop_event):
    del stop_event
    import json as j  # pylint: disable=g-import-not-at-top,reimported
    import sys as s  # pylint: disable=g-import-not-at-top,reimported
    with open(report, 'w') as f:
      j.dump(sorted(m for m in s.modules if m.split('.')[0] in ('tensorflow', 'reverb')), f)

  Supervisor(target, {}, 'learner', stop_event=threading.Event()).run()
  with open(report) as f:
    assert json.load(f) == []
