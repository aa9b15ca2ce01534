"""Probes of the V-trace learner on real Pong frames: what an optimizer does to the net.

Pong's training average sat at random's for the first 2M env steps (README, "Pong
learns"), and a 1M-env-step run costs ~20 minutes here, so settings are first compared
on what a few hundred updates show: unrolls of random Pong play (real frames and
rewards, from ale-py's vector engine) are trained on for N updates, and per layer we
read how far the parameters moved per update (mean |step|) relative to the learning rate (Adam
moves every weight by ~lr when epsilon is negligible; epsilon or a small RMSprop
mean square shrinks that), which conv units are still alive, and how much the value
differs between frames. `bench/optimizer_probe.py` runs it; the random-play unrolls
and the liveness count come from the tests' support (`tests/unit/pong_unrolls.py`),
which the torso and optimizer tests train on.
"""

from typing import Any, Dict, List

import numpy as np
import tensorflow as tf

from tests.unit.pong_unrolls import conv_alive


def probe(learner, network, unrolls, batch_size: int, updates: int,
          learning_rate: float, seed: int = 1) -> Dict[str, Any]:
  """Trains `learner` on random batches of `unrolls`; reports what moved and how much."""
  frames = tf.constant(np.stack([u['observation'][0] for u in unrolls[::2]]))
  torso = network.torso
  alive_before = conv_alive(torso, frames)
  rng = np.random.RandomState(seed)
  variables = network.trainable_variables
  step_sizes: List[List[float]] = [[] for _ in variables]
  metrics = {}
  for i in range(updates):
    idx = rng.choice(len(unrolls), batch_size, replace=False)
    before = [v.numpy() for v in variables] if i >= updates - 10 else None
    metrics = learner.train_on({k: tf.constant(np.stack([unrolls[j][k] for j in idx]))
                                for k in unrolls[0]})
    if before is not None:
      for s, v, b in zip(step_sizes, variables, before):
        s.append(float(np.mean(np.abs(v.numpy() - b))) / learning_rate)
  (_, values), _ = network(frames, ())
  return {'alive_before': alive_before.tolist(),
          'alive_after': conv_alive(torso, frames).tolist(),
          'step_over_lr': [{'name': v.name, 'shape': v.shape.as_list(),
                            'value': float(np.mean(s))} for v, s in zip(variables, step_sizes)],
          'value_spread': float(np.std(values.numpy())),
          'entropy': metrics.get('entropy'), 'loss': metrics.get('loss')}
