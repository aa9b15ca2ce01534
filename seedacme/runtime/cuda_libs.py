"""CUDA 11 / cuDNN 8 libraries from pip wheels, loaded before TensorFlow looks for them.

TF 2.8.4 finds its GPU libraries by soname at run time (`dlopen("libcudart.so.11.0")`,
`libcublas.so.11`, `libcudnn.so.8`, ...) and falls back to the CPU when one is missing.
The Vertex accelerator pool gets them as NVIDIA's `nvidia-*-cu11` wheels
(`requirements/vertex_gpu.txt`), which put them under `site-packages/nvidia/<lib>/lib`,
a directory the dynamic loader does not search -- and `LD_LIBRARY_PATH` is read only when
a process starts, so setting it from Python is too late. `preload()` therefore loads each
library by its full path with `RTLD_GLOBAL` before TensorFlow is imported: the loader
then answers TensorFlow's later `dlopen` by soname with the library already loaded.
It also points XLA (the policy step is `jit_compile`d) at the nvcc wheel's `libdevice`
and `ptxas`. Without the wheels (CPU machines) it does nothing: a few `stat` calls.

Call it in the process that will import TensorFlow, before the import: the central node's
child process does (`supervisor.serve_central`).
"""

import ctypes
import os
import sys
from typing import Dict, List, Sequence, Tuple

from absl import logging

# (wheel directory under nvidia/, soname) in dependency order: cublasLt before cublas,
# cublas before cusolver and cudnn. The sonames TF 2.8.4 asks for (CUDA 11, cuDNN 8).
CUDA_LIBRARIES: Tuple[Tuple[str, str], ...] = (
    ('cuda_runtime', 'libcudart.so.11.0'),
    ('cublas', 'libcublasLt.so.11'),
    ('cublas', 'libcublas.so.11'),
    ('cufft', 'libcufft.so.10'),
    ('curand', 'libcurand.so.10'),
    ('cusparse', 'libcusparse.so.11'),
    ('cusolver', 'libcusolver.so.11'),
    ('cudnn', 'libcudnn.so.8'),
)
# libcudnn.so.8 opens its parts (libcudnn_cnn_infer.so.8, ...) itself, through its
# RUNPATH ($ORIGIN): they load only when used.

# The GPU driver's library is the host's, not a wheel's. Where it is not on the loader's
# path, GPU containers commonly have it here (GKE's driver mount).
DRIVER_LIBRARY = 'libcuda.so.1'
DRIVER_DIRS = ('/usr/local/nvidia/lib64', '/usr/local/nvidia/lib')

_loaded: Dict[str, str] = {}  # soname -> path, this process


def find_libraries(paths: Sequence[str] | None = None,
                   libraries: Sequence[Tuple[str, str]] = CUDA_LIBRARIES) -> Dict[str, str]:
  """{soname: full path} of the wheels' libraries under `paths` (default `sys.path`)."""
  found = {}
  for directory, soname in libraries:
    for entry in sys.path if paths is None else paths:
      path = os.path.join(entry or '.', 'nvidia', directory, 'lib', soname)
      if os.path.isfile(path):
        found[soname] = os.path.abspath(path)
        break
  return found


def _cuda_data_dir(paths: Sequence[str] | None) -> str | None:
  """The nvcc wheel's root (holds nvvm/libdevice and bin/ptxas), if installed."""
  for entry in sys.path if paths is None else paths:
    root = os.path.join(entry or '.', 'nvidia', 'cuda_nvcc')
    if os.path.isdir(os.path.join(root, 'nvvm', 'libdevice')):
      return os.path.abspath(root)
  return None


def _load_driver() -> None:
  try:
    ctypes.CDLL(DRIVER_LIBRARY, mode=ctypes.RTLD_GLOBAL)
    return
  except OSError:
    pass
  for directory in DRIVER_DIRS:
    path = os.path.join(directory, DRIVER_LIBRARY)
    if os.path.isfile(path):
      try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return
      except OSError as e:
        logging.warning('CUDA: cannot load the driver library %s: %s', path, e)


def preload(paths: Sequence[str] | None = None,
            libraries: Sequence[Tuple[str, str]] = CUDA_LIBRARIES) -> List[str]:
  """Loads the pip-installed CUDA libraries; returns their paths ([]: no wheels, no-op).

  Idempotent. Also sets `XLA_FLAGS=--xla_gpu_cuda_data_dir=<nvcc wheel>` unless
  XLA_FLAGS already names one. A library that fails to load is logged and skipped:
  `devices.compute_device` then refuses a launch that asked for a GPU.
  """
  found = find_libraries(paths, libraries)
  if not found:
    return []
  if 'tensorflow' in sys.modules and not _loaded:
    logging.warning('CUDA: TensorFlow was imported before the CUDA libraries were '
                    'preloaded; it may not see the GPU (call cuda_libs.preload() first)')
  loaded = []
  for soname, path in found.items():
    if soname not in _loaded:
      try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
      except OSError as e:
        logging.warning('CUDA: cannot load %s: %s', path, e)
        continue
      _loaded[soname] = path
    loaded.append(path)
  _load_driver()
  data_dir = _cuda_data_dir(paths)
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if data_dir and '--xla_gpu_cuda_data_dir' not in xla_flags:
    os.environ['XLA_FLAGS'] = f'{xla_flags} --xla_gpu_cuda_data_dir={data_dir}'.strip()
  wheels = os.path.dirname(os.path.dirname(os.path.dirname(loaded[0]))) if loaded else '-'
  logging.info('CUDA: loaded %d of %d libraries from the nvidia-*-cu11 wheels in %s; '
               'XLA_FLAGS=%s', len(loaded), len(libraries), wheels,
               os.environ.get('XLA_FLAGS', ''))
  return loaded
