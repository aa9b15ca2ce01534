"""The central node's one end of a run, `finish(reason)`, whichever stop it was.

A real central node (V-trace on Catch, a real Reverb server, in-process actor threads),
run by its own main loop until a budget, with no program stopper: the run still leaves
its final checkpoint and the policy export, the summary is written once, and its rates
are the progress log's steady rate (not the shutdown window's, as when every record
reset the rate window and a second summary overwrote the first).
"""

import os
import threading

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


@pytest.mark.timeout(120)
def test_a_budget_stop_without_a_program_stopper_checkpoints_exports_and_summarizes_once(
    tmp_path):
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                     hidden_sizes=(16,)))
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  logdir = str(tmp_path)
  config = ProgramConfig(num_actors=2, envs_per_actor=4, num_eval_envs=0, logdir=logdir,
                         max_seconds=None, max_learner_steps=150,
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

  summary = read_summary(logdir)
  assert summary['stop'] == {'kind': 'learner_steps', 'value': 150, 'threshold': 150}
  assert summary['learner_steps'] == 150  # the learner stopped at the budget, not after
  assert stop.is_set()  # the node stopped itself
  # The final checkpoint (the periodic one was 10 minutes away) and the export.
  restored = Checkpointer(os.path.join(logdir, 'checkpoints'),
                          builder.make_learner(builder.make_networks(spec), client, spec)
                          .checkpoint_state(), 600.0).restore()
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
