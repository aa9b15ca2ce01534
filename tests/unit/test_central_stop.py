"""A planned stop (SIGTERM) of a real central child under its real supervisor: the
child gets the central node's grace, `finish` waits for the learner's step in flight
as long as it may and writes the last checkpoint, and the child exits by itself.

Before, the supervisor killed every child 6 s after SIGTERM and `finish`, having waited
5 s for a learner still in its step, skipped the last checkpoint. The learner here
sleeps 7 s in every step (a slow step, or one blocked on a replay server), and the
stop comes while it sleeps.
"""

import os
import threading
import time

import cloudpickle
import portpicker
import pytest
import reverb

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.nodes import central_process

STEP_S = 7.0


def _slow_builder(marker: str, **config):
  """A V-trace builder whose learner sleeps `STEP_S` in each step, after touching
  `marker` (made here: cloudpickle sends it by value to the child)."""

  class SlowLearner:

    def __init__(self, learner):
      self._learner = learner

    def __getattr__(self, name):
      return getattr(self._learner, name)

    def step(self):
      open(marker, 'w').close()
      time.sleep(STEP_S)
      return self._learner.step()

  class SlowBuilder(vtrace.VTraceBuilder):

    def make_learner(self, *args, **kwargs):
      return SlowLearner(super().make_learner(*args, **kwargs))

  return SlowBuilder(vtrace.VTraceConfig(**config))


@pytest.mark.timeout(180)
def test_sigterm_leaves_the_central_child_time_to_write_its_last_checkpoint(tmp_path,
                                                                          wait_until):
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  marker = str(tmp_path / 'in_step')
  builder = _slow_builder(marker, unroll_length=5, batch_size=2, hidden_sizes=(8,))
  replay = reverb.Server(builder.make_replay_tables(spec), port=None)
  logdir = str(tmp_path / 'run')
  config = ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0, logdir=logdir,
                         max_seconds=600.0, checkpoint_interval_s=600.0,
                         progress_interval_s=1.0, transport='courier', export_policy=False)
  kwargs = dict(port=portpicker.pick_unused_port(), courier_kwargs={},
                payload=cloudpickle.dumps(dict(builder=builder, spec=spec, config=config,
                                               stop_program=None)),
                replay_address=f'localhost:{replay.port}')
  stop = threading.Event()
  sup = central_process.central_supervisor(kwargs, stop_event=stop)
  thread = threading.Thread(target=sup.run)
  thread.start()
  try:
    assert wait_until(lambda: os.path.exists(marker), 120), 'the learner never stepped'
    stopping = time.monotonic()
    stop.set()  # what Launchpad's SIGTERM does to the supervisor
    thread.join(30)
    stopped_in = time.monotonic() - stopping
  finally:
    stop.set()
    thread.join(30)
    replay.stop()
  assert not thread.is_alive()
  # It waited for the learner (4 s), saved, and exited by itself within the grace.
  assert sup.child.returncode == 0, sup.child.returncode
  assert 4.0 <= stopped_in < central_process.CENTRAL_STOP_TIMEOUT_S, stopped_in
  checkpoints = os.path.join(logdir, 'checkpoints')
  assert os.path.exists(os.path.join(checkpoints, 'checkpoint')), os.listdir(logdir)
