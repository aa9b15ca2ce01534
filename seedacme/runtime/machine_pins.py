"""What a reproducible run fixes about the machine, so that one command gives the same
bits on another x86-64 CPU (issue 63, Deliver 6).

Op determinism (`tf.config.experimental.enable_op_determinism`) makes TF give the same
bits for the same inputs on one machine. Across machines three more things choose
kernels or summation orders at run time; each was probed here (a Xeon with AVX-512 and
AMX, TF 2.8.4 with oneDNN on, numpy 1.23.5; docs/history.md "Which bits a CPU decides"):

* oneDNN (TF's matmul and conv kernels on the CPU, on by default here) picks its
  kernels by the CPU's instruction set: a matmul with a 4,096-long inner dimension and
  a conv's weight gradient gave other bits under `ONEDNN_MAX_CPU_ISA=AVX2` than with
  the machine's AVX-512/AMX (AVX and SSE4.1: others again).
* numpy dispatches exp, log, tanh, sin and cos (float64 and float32) to AVX-512 where
  the CPU has it: other bits than on an AVX2 CPU. OpenBLAS picks its kernels by CPU
  too (a float64 dot product differed between its SkylakeX and Haswell kernels) and
  splits work by its thread count.
* TF's intra-op thread count shapes Eigen's reductions (a mean over 278k floats: the
  same bits with 1, 2 or 4 threads, others with 8), and TF's default count is the
  machine's number of cores.

So a reproducible run's processes run as on an AVX2 CPU with FMA (x86-64-v3: Intel
since Haswell, 2013, and every AMD Zen) with a fixed thread count (`pinned_environ`):
`ONEDNN_MAX_CPU_ISA=AVX2`, `NPY_DISABLE_CPU_FEATURES` = the AVX-512 features this CPU
has, `OPENBLAS_CORETYPE=Haswell`, `OPENBLAS_NUM_THREADS=1`, and TF's intra-op threads =
`ProgramConfig.reproducible_threads` (default 2, what the published runs had). numpy
and oneDNN read their variables when they load, so they are put in the launching
process's environment (`pin_environ`, by `make_program`) and every node process
inherits them; on a cluster each host's launcher computes its own CPU's list. A value
the user set is kept (another cap is another run). The central node records what its
own process has (`describe`: the summary's `reproducible_machine`), and names what is
not pinned there (`unpinned`), never hides it.

What can still differ: a CPU without AVX2 and FMA or an ARM CPU (other kernels
throughout; such a run is exact against itself, not against the published figures);
other builds of TF, numpy, MuJoCo or glibc (the constraints pin the Python ones; glibc's
libm is the OS's); a GPU's kernels; DMLab and Football engines (not probed).

Cost, on this AVX-512 machine (bench/learner_speed.py, variants side by side at load
5; bench/published/learner_speed_pins*.json): the Nature CNN V-trace learner step at
0.81x (0.69x in a first run) with the pins, 1.04x with oneDNN capped at AVX-512
instead; PPO's MLP step 1.05x (no cost). A user who wants the speed and needs
agreement only with AVX-512 CPUs sets `ONEDNN_MAX_CPU_ISA=AVX512_CORE` (kept and
recorded).

Standard library only: the launchers import it before TensorFlow.
"""

import os
from typing import Dict, List

ONEDNN_ISA = 'AVX2'
OPENBLAS_CORE = 'Haswell'


def numpy_wide_features() -> List[str]:
  """The AVX-512 features numpy dispatches kernels to on this CPU (empty without
  AVX-512), as numpy sees them in this process: after `NPY_DISABLE_CPU_FEATURES` they
  read False. Features numpy has no kernels for cannot be disabled (numpy warns)."""
  try:
    from numpy.core import _multiarray_umath  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  features = getattr(_multiarray_umath, '__cpu_features__', {})
  dispatched = getattr(_multiarray_umath, '__cpu_dispatch__', [])
  return [name for name in dispatched
          if name.startswith('AVX512') and features.get(name)]


def pinned_environ(environ=None) -> Dict[str, str]:
  """The variables a reproducible run's processes get, where `environ` lacks them."""
  environ = os.environ if environ is None else environ
  wanted = {'ONEDNN_MAX_CPU_ISA': ONEDNN_ISA, 'OPENBLAS_CORETYPE': OPENBLAS_CORE,
            'OPENBLAS_NUM_THREADS': '1'}
  wide = numpy_wide_features()
  if wide:
    wanted['NPY_DISABLE_CPU_FEATURES'] = ' '.join(wide)
  return {k: v for k, v in wanted.items() if k not in environ}


def pin_environ() -> Dict[str, str]:
  """Puts `pinned_environ()` into this process's environment, for the processes it
  starts; returns what it set."""
  added = pinned_environ()
  os.environ.update(added)
  return added


def pin_tf_threads(threads: int) -> None:
  """TF's intra-op threads, before TF's runtime starts (after, TF refuses: RuntimeError
  naming it). oneDNN reads its cap at its first kernel, so it is set here too."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('ONEDNN_MAX_CPU_ISA', ONEDNN_ISA)
  if tf.config.threading.get_intra_op_parallelism_threads() != threads:
    tf.config.threading.set_intra_op_parallelism_threads(threads)


def describe(threads: int) -> Dict[str, object]:
  """What this process runs with, for the summary: the pins, the CPU, and the names of
  the pins not in effect here (a process not started by a pinned launcher)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  env = {k: os.environ.get(k) for k in ('ONEDNN_MAX_CPU_ISA', 'NPY_DISABLE_CPU_FEATURES',
                                        'OPENBLAS_CORETYPE', 'OPENBLAS_NUM_THREADS',
                                        'TF_ENABLE_ONEDNN_OPTS')}
  intra = tf.config.threading.get_intra_op_parallelism_threads()
  unpinned = []
  if env['ONEDNN_MAX_CPU_ISA'] != ONEDNN_ISA:
    unpinned.append(f"oneDNN's instruction set ({env['ONEDNN_MAX_CPU_ISA'] or 'the CPU'})")
  wide = numpy_wide_features()
  if wide:
    unpinned.append(f"numpy's AVX-512 kernels ({' '.join(wide)})")
  if env['OPENBLAS_CORETYPE'] != OPENBLAS_CORE:
    unpinned.append(f"OpenBLAS's kernels ({env['OPENBLAS_CORETYPE'] or 'the CPU'})")
  if intra != threads:
    unpinned.append(f"TF's intra-op threads ({intra}, not {threads})")
  flags, model = _cpu_flags_and_model()
  return {'cpu': model, 'avx2_fma': ('avx2' in flags and 'fma' in flags) if flags else None,
          'intra_op_threads': intra, 'environ': env, 'unpinned': unpinned}


def _cpu_flags_and_model():
  """This CPU's flags and model name from /proc/cpuinfo (empty and None elsewhere)."""
  flags, model = set(), None
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        key = key.strip()
        if key == 'flags' and not flags:
          flags = set(value.split())
        elif key == 'model name' and model is None:
          model = value.strip()
  except OSError:
    pass
  return flags, model
