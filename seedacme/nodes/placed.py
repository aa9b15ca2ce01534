"""The central node's networks placed on their devices: the learner's, and inference's.

With inference and learning on one device (the default without accelerators, or with
one), both use the same network objects: inference reads the learner's variables and
nothing is copied. With inference on its own device (`seedacme.runtime.placement`), it
gets its own copy of the policy's variables there, copied after every learner step
(`PolicySync`: at most one step stale), and the learner's variables live on the
learner's devices (data-parallel over several: `seedacme.learner.replicas`).
`ProgramConfig.policy_copy` asks for the copy on a shared device too, and so does a
lagged reproducible schedule (`reproducible_lag` >= 1: the learner trains while a
round acts; the round gate, not the learner loop, calls the copy, once per round).
"""

import dataclasses
from typing import Any

from absl import logging
import tensorflow as tf

from seedacme.builder import SeedBuilder
from seedacme.config import ProgramConfig
from seedacme.learner.replicas import LearnerDevices, PolicySync
from seedacme.runtime.placement import Placement, PlacementError
from seedacme.runtime.placement import resolve as resolve_placement
from seedacme.types import EnvSpec


@dataclasses.dataclass
class PlacedNetworks:
  placement: Placement
  learner_devices: LearnerDevices
  learner: Any  # the builder's networks, on the learner's devices
  inference: Any  # the same objects, or a copy on the inference device
  sync: PolicySync | None  # copies learner -> inference after each step (a copy only)


def place_networks(builder: SeedBuilder, spec: EnvSpec,
                   config: ProgramConfig) -> PlacedNetworks:
  """Resolves the placement (refusing an impossible one) and builds the networks."""
  placement = resolve_placement(config.inference_devices, config.learner_devices)
  named = config.inference_devices or config.learner_devices
  devices = LearnerDevices(() if placement.shared and not named else placement.learner)
  if devices.num_replicas > 1 and not builder.multi_device_learner:
    raise PlacementError(f'agent {builder.name!r} learns on one device; '
                         f'--learner_devices gave {", ".join(devices.devices)}')
  with devices.activate():
    learner = builder.make_networks(spec)
  lagged = config.reproducible and config.reproducible_lag > 0
  if placement.shared and not config.policy_copy and not lagged:
    return PlacedNetworks(placement, devices, learner, learner, None)
  with tf.device(placement.inference):
    inference = builder.make_networks(spec)
  logging.info('Inference serves its own copy of the policy on %s, copied %s%s',
               placement.inference,
               'at each round\'s start' if lagged else 'after each learner step',
               ' (policy_copy)' if placement.shared and config.policy_copy else '')
  sync = PolicySync(builder.policy_network(learner).variables,
                    builder.policy_network(inference).variables)
  return PlacedNetworks(placement, devices, learner, inference, sync)
