"""Where inference and learning run: device names for each, from flags and what TF sees.

SEED's gain comes from moving the forward pass onto the learner host's accelerator and
from spreading the learner over several. The central node places two things:

* inference: the batched policy step and every env's recurrent state (one device);
* the learner: its variables and SGD step (one device, or several, data-parallel
  through `seedacme.learner.replicas`).

`--inference_devices` / `--learner_devices` take device names ('GPU:1', 'GPU:2,GPU:3',
'/device:CPU:1') or counts ('2'). Defaults, by the accelerators TF sees: none -> both on
CPU:0 (as before); one -> both on it; two or more -> inference on the first, learning
on the rest. Counts take accelerators in order (inference first), or logical CPUs when
there are none (`logical_cpus`: the CPU split into N devices, which is how this is
tested on a CPU-only machine). A placement that cannot be (a device TF does not see, a
device listed twice) stops the central node at start-up with a message naming what TF
sees. More than one inference device is refused too: env state lives on one device
(README, departures).
"""

import dataclasses
from typing import Callable, List, Sequence, Tuple

from absl import logging

ACCELERATORS = ('TPU', 'GPU')


class PlacementError(ValueError):
  """The placement asked for cannot be made on the devices TensorFlow sees."""

  fatal = True  # a supervisor does not restart it (see seedacme.runtime.supervisor)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Full TF device names ('/device:GPU:1') for inference and for the learner."""
  inference: str
  learner: Tuple[str, ...]

  @property
  def shared(self) -> bool:
    """Inference and learning use the same variables on the same single device."""
    return self.learner == (self.inference,)

  def describe(self) -> str:
    return f'inference on {self.inference}; learner on {", ".join(self.learner)}'


def split_cpu(num_devices: int) -> None:
  """Splits the CPU into `num_devices` logical devices (before TF first lists them)."""
  if num_devices <= 1:
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])


def _tf_device_names() -> List[str]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [d.name for d in tf.config.list_logical_devices()]


def canonical(name: str) -> str:
  """'GPU:1', '/GPU:1', 'gpu:1', '/device:GPU:1' -> '/device:GPU:1'."""
  short = name.strip().split('device:')[-1].lstrip('/').upper()
  kind, _, index = short.partition(':')
  return f'/device:{kind}:{index or 0}'


def _parse(spec: str | None) -> int | List[str] | None:
  if spec is None or str(spec).strip() in ('', '0'):
    return None
  spec = str(spec).strip()
  if spec.isdigit():
    return int(spec)
  return [canonical(part) for part in spec.split(',') if part.strip()]


def resolve(inference_devices: str | None, learner_devices: str | None,
            list_devices: Callable[[], Sequence[str]] = _tf_device_names) -> Placement:
  """The placement the flags ask for, checked against the devices TF sees."""
  seen = [canonical(d) for d in list_devices()]
  accelerators = [d for kind in ACCELERATORS for d in seen if f':{kind}:' in d]
  cpus = [d for d in seen if ':CPU:' in d]
  pool = accelerators or cpus
  inference, learner = _parse(inference_devices), _parse(learner_devices)
  visible = ', '.join(seen)

  def take(count: int, skip: Sequence[str], what: str) -> List[str]:
    free = [d for d in pool if d not in skip]
    if count > len(free):
      raise PlacementError(f'{what}: {count} devices asked for, but only {len(free)} are '
                           f'free of {len(pool)} ({", ".join(pool)}); TensorFlow sees: '
                           f'{visible}')
    return free[:count]

  if isinstance(inference, int):
    inference = take(inference, [], '--inference_devices')
  if isinstance(learner, int):
    # Learner devices come after the inference device, unless there is only one.
    skip = (inference or pool[:1]) if len(pool) > 1 else []
    learner = take(learner, skip, '--learner_devices')
  if inference is None:
    inference = [pool[0]]
  if learner is None:
    rest = [d for d in pool if d not in inference]
    learner = rest if len(accelerators) > 1 and rest else [inference[0]]
  for what, names in (('--inference_devices', inference), ('--learner_devices', learner)):
    unknown = [d for d in names if d not in seen]
    if unknown:
      raise PlacementError(f'{what}: {", ".join(unknown)} not found; TensorFlow sees: '
                           f'{visible}')
    twice = sorted({d for d in names if names.count(d) > 1})
    if twice:
      raise PlacementError(f'{what}: {", ".join(twice)} listed twice')
  if len(inference) > 1:
    raise PlacementError(f'--inference_devices: {len(inference)} devices '
                         f'({", ".join(inference)}); the central node serves from one '
                         'device (every env\'s recurrent state lives there)')
  placement = Placement(inference[0], tuple(learner))
  logging.info('Placement: %s (TensorFlow sees %s)', placement.describe(), visible)
  return placement
