"""A reproducible run computes as on an AVX2 CPU with a fixed thread count
(`seedacme.runtime.machine_pins`): what can be tested on one machine.

Each case is a fresh process (numpy and oneDNN read their caps when they load) that
computes what a learner and the server do -- a conv torso's and an MLP's gradients
through oneDNN, a mean over a large tensor (Eigen's reduction), numpy's float64 exp
and tanh, an OpenBLAS dot -- and prints a hash of the bits. Pinned as `make_program`
pins a launcher (the child inherits the environment) and as the central node fixes its
threads, the bits are the same on all of this machine's cores and on one core (where
TF's default would be one thread). Unpinned, on a CPU with AVX-512, they are not the
pinned bits: the pins change what runs (on another CPU that part is not checked).
"""

import os
import subprocess
import sys

import pytest

from seedacme.runtime import machine_pins

PINS = ('ONEDNN_MAX_CPU_ISA', 'NPY_DISABLE_CPU_FEATURES', 'OPENBLAS_CORETYPE',
        'OPENBLAS_NUM_THREADS')

COMPUTE = r'''
import hashlib, sys
import numpy as np
from seedacme.runtime import machine_pins
if sys.argv[1] == 'pinned':
  machine_pins.pin_tf_threads(2)
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
rng = np.random.default_rng(0)
out = []
x = tf.constant(rng.standard_normal((64, 4096)).astype(np.float32))
w = tf.Variable(rng.standard_normal((4096, 64)).astype(np.float32))
frames = tf.constant(rng.standard_normal((32, 84, 84, 4)).astype(np.float32))
k = tf.Variable(rng.standard_normal((8, 8, 4, 32)).astype(np.float32))
with tf.GradientTape() as tape:
  loss = tf.reduce_sum(tf.tanh(x @ w)) + tf.reduce_sum(tf.nn.conv2d(frames, k, 4, 'VALID') ** 2)
out += [g.numpy() for g in tape.gradient(loss, [w, k])]
out.append(tf.reduce_mean(tf.constant(rng.standard_normal((17, 16384)).astype(np.float32))).numpy())
v = rng.standard_normal(100_000) * 5
out += [np.exp(v), np.tanh(v), np.array(v @ v)]
print(hashlib.sha256(b''.join(np.asarray(o).tobytes() for o in out)).hexdigest())
print(machine_pins.describe(2)['unpinned'])
'''


def _compute(mode: str, env: dict, cores: str | None = None):
  command = [sys.executable, '-c', COMPUTE, mode]
  if cores is not None:
    command = ['taskset', '-c', cores] + command
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  digest, unpinned = done.stdout.strip().splitlines()[-2:]
  return digest, unpinned


def _bare_environ() -> dict:
  return {k: v for k, v in os.environ.items() if k not in PINS}


@pytest.mark.timeout(600)
def test_pinned_bits_do_not_depend_on_the_cores_and_unpinned_ones_differ_on_avx512():
  bare = _bare_environ()
  pinned = dict(bare, **machine_pins.pinned_environ(bare))
  whole, unpinned_names = _compute('pinned', pinned)
  assert unpinned_names == '[]'  # describe() finds every pin in effect
  if len(os.sched_getaffinity(0)) > 1:
    one_core = min(os.sched_getaffinity(0))
    assert _compute('pinned', pinned, cores=str(one_core))[0] == whole
  free, free_unpinned = _compute('free', bare)
  assert 'oneDNN' in free_unpinned and 'OpenBLAS' in free_unpinned
  if machine_pins.numpy_wide_features():
    assert free != whole  # AVX-512 kernels give other bits: what the pins are for
    assert 'numpy' in free_unpinned
  # (Without AVX-512 the unpinned bits may or may not be the pinned ones: OpenBLAS's
  # own core type for this CPU, e.g. Zen, is not Haswell's.)


def test_a_users_own_cap_is_kept_and_the_rest_added():
  env = {'ONEDNN_MAX_CPU_ISA': 'SSE41', 'PATH': '/bin'}
  added = machine_pins.pinned_environ(env)
  assert 'ONEDNN_MAX_CPU_ISA' not in added
  assert added['OPENBLAS_CORETYPE'] == 'Haswell' and added['OPENBLAS_NUM_THREADS'] == '1'
  wide = machine_pins.numpy_wide_features()
  assert added.get('NPY_DISABLE_CPU_FEATURES', '') == ' '.join(wide)
  assert all(name.startswith('AVX512') for name in wide)
