"""The central node refuses to run on the CPU when the launch asked for an accelerator."""

import pytest

from seedacme.runtime import devices


def test_asked_for_a_gpu_and_tensorflow_sees_none_is_refused_by_name():
  # This machine's real TensorFlow: no GPU here (the CI machines have none either).
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.config.list_logical_devices('GPU'):
    pytest.skip('this machine has a GPU')
  with pytest.raises(devices.AcceleratorMissingError, match=r'asked for a V100 \(GPU\).*CPU'):
    devices.compute_device('V100')
  assert devices.compute_device(None) == 'CPU'


def test_the_device_kind_must_match_what_was_asked_for():
  with pytest.raises(devices.AcceleratorMissingError, match='TPU_V3'):
    devices.compute_device('TPU_V3', list_devices=lambda: ['CPU', 'GPU'])
  assert devices.compute_device('T4', list_devices=lambda: ['CPU', 'GPU']) == 'GPU'
  assert devices.compute_device(None, list_devices=lambda: ['CPU', 'TPU']) == 'TPU'


def test_a_supervised_central_node_without_its_accelerator_stops_instead_of_restarting():
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from seedacme.runtime.supervisor import Supervisor  # pylint: disable=g-import-not-at-top

  def central_without_gpu(stop_event):
    del stop_event
    from seedacme.runtime import devices as d  # pylint: disable=g-import-not-at-top,reimported
    d.compute_device('V100', list_devices=lambda: ['CPU'])

  supervisor = Supervisor(central_without_gpu, {}, 'learner', stop_event=threading.Event())
  started = time.monotonic()
  with pytest.raises(RuntimeError, match='refused to run'):
    supervisor.run()
  assert supervisor.restarts == 0 and time.monotonic() - started < 60
