"""Base for server-side policies whose network is a Sonnet module run by TensorFlow."""

from typing import Any

import numpy as np
import tensorflow as tf
import tree

from seedacme.policy import ServerPolicy

Nest = Any


def default_device() -> str:
  """The accelerator for inference if there is one, else the CPU."""
  for kind in ('TPU', 'GPU'):
    if tf.config.list_logical_devices(kind):
      return f'/{kind}:0'
  return '/CPU:0'


class TFServerPolicy(ServerPolicy):
  """Holds the network, the inference device and a seeded RNG; numpy state in/out."""

  def __init__(self, network, seed: int = 0, device: str = ''):
    self._network = network
    self._device = device or default_device()
    self._rng = tf.random.Generator.from_seed(seed)

  def initial_state(self, batch_size: int) -> Nest:
    return tree.map_structure(lambda x: np.asarray(x), self._network.initial_state(batch_size))
