"""The central node's one end of a run, `finish(reason)`, whichever stop it was.

A real central node (V-trace on Catch, a real Reverb server, in-process actor threads),
run by its own main loop until a budget, with no program stopper: the run still leaves
its final checkpoint and the policy export, the summary is written once, and its rates
are the progress log's steady rate (not the shutdown window's, as when every record
reset the rate window and a second summary overwrote the first). A resumed node whose
inference holds its own copy of the policy serves the checkpoint's weights at once.
"""

import os
import threading

import numpy as np
import pytest
import reverb

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.learner.checkpointing import Checkpointer
from seedacme.nodes.central import CentralNode
from seedacme.run.logdir import read_progress, read_summary
from seedacme.run.monitor import StopKind, StopReason
from tests.unit.central_stand_ins import act


def _run_to_budget(logdir: str, max_learner_steps: int):
  """A real central node on Catch run by its own loop until `max_learner_steps`, with
  no program stopper; returns (builder, spec, the node) once it has stopped."""
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                     hidden_sizes=(16,)))
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  config = ProgramConfig(num_actors=2, envs_per_actor=4, num_eval_envs=0, logdir=logdir,
                         max_seconds=None, max_learner_steps=max_learner_steps,
                         progress_interval_s=0.25, checkpoint_interval_s=600.0,
                         learner_step_delay_s=0.01)  # >= 1.5 s: several records
  stop = threading.Event()
  client = reverb.Client(f'localhost:{server.port}')
  central = CentralNode(builder, spec, config, client,
                        stop_program=None, stop_event=stop)
  actors = [threading.Thread(target=act, args=(central, factory, 4 * i, 4, stop),
                             daemon=True) for i in range(2)]
  try:
    for a in actors:
      a.start()
    central.run()  # returns once the budget is reached: nobody else stops it
    for a in actors:
      a.join(10)
      assert not a.is_alive()
  finally:
    stop.set()
    central.shutdown()
    server.stop()
  assert stop.is_set()  # the node stopped itself
  return builder, spec, central


def _restored(logdir: str, builder, spec):
  client = reverb.Client('localhost:1')  # never called: the learner is only restored
  return Checkpointer(os.path.join(logdir, 'checkpoints'),
                      builder.make_learner(builder.make_networks(spec), client, spec)
                      .checkpoint_state(), 600.0).restore()


@pytest.mark.timeout(120)
def test_a_budget_stop_without_a_program_stopper_checkpoints_exports_and_summarizes_once(
    tmp_path):
  logdir = str(tmp_path)
  builder, spec, central = _run_to_budget(logdir, 150)

  summary = read_summary(logdir)
  assert summary['stop'] == {'kind': 'learner_steps', 'value': 150, 'threshold': 150}
  assert summary['learner_steps'] == 150  # the learner stopped at the budget, not after
  # The final checkpoint (the periodic one was 10 minutes away) and the export.
  restored = _restored(logdir, builder, spec)
  assert restored is not None and restored['learner_steps'] == 150
  assert restored['env_steps'] >= summary['env_steps']  # actors ran until the end
  assert os.path.isfile(os.path.join(logdir, 'saved_model', 'saved_model.pb'))

  # The summary's rate is the progress log's steady rate: first record to last.
  records = read_progress(logdir)
  assert len(records) >= 3
  first, last = records[0], records[-1]
  steady = (last['env_steps'] - first['env_steps']) / (last['elapsed_s'] - first['elapsed_s'])
  assert summary['env_steps_per_s'] == pytest.approx(steady, rel=0.02)
  assert summary['steady_window_s'] == pytest.approx(
      last['elapsed_s'] - first['elapsed_s'], rel=0.02)
  # Batch statistics over the whole run, not the last interval's.
  assert summary['inference_batches'] >= sum(r['inference_batches'] for r in records)

  # Written once: a second finish (e.g. a late signal) returns it and writes nothing.
  path = os.path.join(logdir, 'summary.json')
  mtime = os.stat(path).st_mtime_ns
  again = central.finish(StopReason(StopKind.STOP_REQUESTED))
  assert again['stop']['kind'] == 'learner_steps'
  assert os.stat(path).st_mtime_ns == mtime


@pytest.mark.timeout(180)
def test_a_resumed_run_stops_at_its_budget_across_starts_and_exports_again(tmp_path):
  """The same logdir started again with a larger learner-step budget (as `run_local`
  does: the last summary removed): it resumes at the checkpoint's step, stops at the
  budget counted over both starts, and writes its last checkpoint and the export."""
  logdir = str(tmp_path)
  _run_to_budget(logdir, 150)
  export = os.path.join(logdir, 'saved_model', 'saved_model.pb')
  first_export = os.stat(export).st_mtime_ns
  os.remove(os.path.join(logdir, 'summary.json'))
  builder, spec, _ = _run_to_budget(logdir, 250)
  summary = read_summary(logdir)
  assert summary['resumed_from_learner_step'] == 150
  assert summary['stop'] == {'kind': 'learner_steps', 'value': 250, 'threshold': 250}
  assert summary['learner_steps'] == 250  # 100 more, not 250 more
  assert _restored(logdir, builder, spec)['learner_steps'] == 250
  assert os.stat(export).st_mtime_ns > first_export  # the resumed policy, exported


def _max_diff(a, b):
  return max(float(np.abs(x.numpy() - y.numpy()).max()) for x, y in zip(a, b))


@pytest.mark.timeout(120)
def test_a_policy_copy_serves_the_restored_weights_from_its_first_step(tmp_path):
  """With `policy_copy`, inference's own copy of a resumed run's policy holds the
  checkpoint's weights before the learner steps again (not its initial ones)."""
  logdir = str(tmp_path)
  builder, spec, _ = _run_to_budget(logdir, 20)
  os.remove(os.path.join(logdir, 'summary.json'))
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  config = ProgramConfig(num_actors=2, envs_per_actor=4, num_eval_envs=0, logdir=logdir,
                         max_seconds=None, max_learner_steps=40,
                         checkpoint_interval_s=600.0, policy_copy=True)
  central = CentralNode(builder, spec, config, reverb.Client(f'localhost:{server.port}'),
                        stop_program=None, stop_event=threading.Event())
  try:
    assert central.resumed_from == 20
    learner = builder.policy_network(central._networks).variables  # pylint: disable=protected-access
    served = builder.policy_network(central._inference_networks).variables  # pylint: disable=protected-access
    initial = builder.policy_network(builder.make_networks(spec)).variables
    assert served[0] is not learner[0]  # its own variables ...
    assert _max_diff(initial, learner) > 0  # (the checkpoint's are not an initial draw)
    assert _max_diff(served, learner) == 0.0  # ... holding the checkpoint's weights
  finally:
    central.shutdown()
    server.stop()
