"""Which device the central node runs on, and a refusal when it is not the one asked for.

TensorFlow falls back to the CPU without a word when it cannot load the CUDA libraries
(TF 2.8.4 needs CUDA 11 / cuDNN 8; `seedacme.runtime.cuda_libs` loads them from pip wheels): a
launch that paid for a V100 would then train on the machine's CPU. The central node therefore logs the device that inference and
learning run on, and a program whose launch asked for an accelerator
(`ProgramConfig.accelerator`) stops with an error naming what is missing instead of
starting without it.
"""

from typing import Callable, List

from absl import logging

ACCELERATOR_KINDS = ('GPU', 'TPU')


class AcceleratorMissingError(RuntimeError):
  """The launch asked for an accelerator and TensorFlow sees none."""

  fatal = True  # a supervisor does not restart it (see seedacme.runtime.supervisor)


def _tf_devices() -> List[str]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [d.device_type for d in tf.config.list_logical_devices()]


def accelerator_kind(name: str) -> str:
  """'GPU' or 'TPU' for a launcher's accelerator name ('V100', 'TPU_V3', ...)."""
  return 'TPU' if name.upper().startswith('TPU') else 'GPU'


def compute_device(required: str | None,
                   list_devices: Callable[[], List[str]] = _tf_devices) -> str:
  """The device type inference and learning will run on ('GPU', 'TPU' or 'CPU').

  Args:
    required: the accelerator the launch asked for (e.g. 'V100', 'TPU_V3'), or None.
    list_devices: device types TensorFlow sees (replaceable to test the refusal's
      wording; by default TensorFlow's logical devices).

  Raises:
    AcceleratorMissingError: `required` is set and TensorFlow sees no device of its kind.
  """
  types = list_devices()
  device = next((k for k in ACCELERATOR_KINDS if k in types), 'CPU')
  if required is not None:
    kind = accelerator_kind(required)
    if kind not in types:
      raise AcceleratorMissingError(
          f'the launch asked for a {required} ({kind}) but TensorFlow sees only '
          f'{sorted(set(types))}: inference and learning would run on the CPU. For a GPU, '
          f'TF 2.8.4 needs CUDA 11 / cuDNN 8 libraries: the nvidia-*-cu11 wheels of '
          f'requirements/vertex_gpu.txt (the Vertex GPU pool has them; the central node '
          f'logs "CUDA: loaded ..." when it finds them) or a CUDA install on the library '
          f'path; `nvidia-smi` shows whether the driver sees the card.')
  logging.info('Central node: inference and learning run on %s (TensorFlow sees %s)',
               device, sorted(set(types)))
  return device
