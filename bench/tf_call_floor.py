"""TensorFlow's per-call floor: what one call of a compiled function costs here.

    .venv/bin/python bench/tf_call_floor.py     # ~30 s

The central node's batch step is one call of a compiled function per batch
(`seedacme/serving/tf_policy.py`), so the cost of a call with almost no work bounds how many
batches per second one server core can run. Measured the way the server calls it
(`tf_policy.direct_call`: the compiled graph, no `tf.function` argument handling), for
a trivial function (x + 1) and for nine 64x64 matmul layers with their variables
captured (about the V-trace Catch MLP's work and variable count), with and without XLA,
batch 16, interleaved in one process (median of 5 rounds of 300 calls, result fetched
with `.numpy()` as the server does). Prints a table, writes
bench/results/tf_call_floor.json.
"""

import os
import sys
import time

import numpy as np

from harness import machine, print_table, write_json

# seedacme first, as the central node imports it: its TF settings (oneDNN) apply.
from seedacme.serving.tf_policy import direct_call  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

ROUNDS, CALLS = 5, 300


def main() -> int:
  layers = [tf.Variable(tf.zeros([64, 64])) for _ in range(9)]

  def mlp(x):
    for v in layers:
      x = tf.matmul(x, v) + 1.0
    return (x,)

  def trivial(x):
    return (x + 1.0,)

  spec = tf.TensorSpec([16, 64], tf.float32)
  calls = {(name, jit): direct_call(tf.function(fn, jit_compile=jit).get_concrete_function(spec))
           for name, fn in (('trivial', trivial), ('mlp 9 layers', mlp)) for jit in (True, False)}
  x = np.ones([16, 64], np.float32)
  times = {key: [] for key in calls}
  for call in calls.values():
    call(x)[0].numpy()  # compile
  for _ in range(ROUNDS):
    for key, call in calls.items():
      start = time.perf_counter()
      for _ in range(CALLS):
        call(x)[0].numpy()
      times[key].append((time.perf_counter() - start) / CALLS * 1e6)
  rows = [{'function': name, 'xla': jit, 'us_per_call': float(np.median(t)),
           'min_us': float(np.min(t)), 'load_1m': os.getloadavg()[0]}
          for (name, jit), t in times.items()]
  print_table(rows, ['function', 'xla', 'us_per_call', 'min_us', 'load_1m'])
  print(f"tf_call_floor: wrote {write_json('tf_call_floor.json', {'machine': machine(), 'rows': rows})}")
  return 0


if __name__ == '__main__':
  sys.exit(main())
