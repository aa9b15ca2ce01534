"""Several gradient steps per sampled batch: the slices and the metrics' mean.

A replay learner (SAC, R2D2) with `sgd_steps_per_sample = k` samples `k * batch_size`
items at once and takes k gradient steps, each on its own consecutive slice, through
its one compiled single step (Acme's `num_sgd_steps_per_step`). What is saved per step
is the sample's round trip and dataset overhead, and R2D2's priority update;
the compiled step stays one step, so tracing it costs what it did (unrolling k steps
into one graph had taken R2D2 CartPole's trace from 7 s to 26 s, all of it before the
first learner step). Measured in bench/learner_share.py (docs/benchmarks.md).
"""

from typing import Any, Dict, List, Sequence

import numpy as np
import tensorflow as tf


def slices(k: int, *nests: Any) -> List[tuple]:
  """Up to k consecutive slices along the first axis of every tensor of `nests`:
  `[(nest_0 slice 0, nest_1 slice 0, ...), ...]`.

  A full sample splits into k equal slices; a short one (Reverb's dataset ends a batch
  early when sampling waited longer than its timeout) into k slices whose sizes differ
  by at most one, or fewer when it holds fewer than k items: no item is dropped and
  none is used twice.
  """
  if k == 1:
    return [nests]
  n = int(tf.nest.flatten(nests)[0].shape[0])
  edges = [i * n // k for i in range(k + 1)]
  return [tuple(tf.nest.map_structure(lambda x, a=a, b=b: x[a:b], nest) for nest in nests)
          for a, b in zip(edges, edges[1:]) if b > a]


def mean_metrics(metrics: Sequence[Dict[str, Any]]) -> Dict[str, float]:
  """The mean of each scalar metric over the steps, as Python floats."""
  return {name: float(np.mean([np.asarray(m[name]) for m in metrics]))
          for name in metrics[0]}
