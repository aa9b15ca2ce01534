"""A resume is the run that was asked for, or a clear refusal; budgets span its starts.

Real central nodes (V-trace on Catch, a real Reverb server, in-process actor threads)
on one logdir, started the way a restarted or rerun central process starts: the first
trains to a learner budget and leaves its final checkpoint; the next one, built with
another config, must stop at start-up naming what differs (on 055f757 it restored what
matched and went on), and one with the same config continues the run's clock.
"""

import json
import os
import threading

import pytest
import reverb

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.nodes.central import CentralNode
from seedacme.run.logdir import read_events
from seedacme.run.monitor import StopKind
from tests.unit.central_stand_ins import act

FACTORY = envs.make_factory('catch')
SPEC = envs.env_spec_of(FACTORY(0))


def _agent(**overrides):
  # The LSTM as wide as the MLP: the heads' shapes agree whichever core (as Catch's
  # defaults, 64 and 64), so only the saved config tells the runs apart.
  return vtrace.VTraceConfig(unroll_length=5, batch_size=4, hidden_sizes=(16,), lstm_size=16,
                             **overrides)


def _config(logdir, **overrides):
  base = dict(num_actors=2, envs_per_actor=4, num_eval_envs=0, logdir=logdir,
              progress_interval_s=0.25, checkpoint_interval_s=600.0, export_policy=False)
  return ProgramConfig(**{**base, **overrides})


class _Node:
  """A central node with its own Reverb server; `close()` stops both."""

  def __init__(self, agent, config):
    builder = vtrace.VTraceBuilder(agent)
    self.server = reverb.Server(builder.make_replay_tables(SPEC), port=None)
    self.stop = threading.Event()
    try:
      self.central = CentralNode(builder, SPEC, config,
                                 reverb.Client(f'localhost:{self.server.port}'),
                                 stop_event=self.stop)
    except BaseException:
      self.server.stop()
      raise

  def train(self):
    """Runs the node with two in-process actors until its budget."""
    actors = [threading.Thread(target=act, args=(self.central, FACTORY, 4 * i, 4, self.stop),
                               daemon=True) for i in range(2)]
    for a in actors:
      a.start()
    try:
      self.central.run()
    finally:
      self.close()
      for a in actors:
        a.join(10)

  def close(self):
    self.stop.set()
    self.central.shutdown()
    self.server.stop()


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A logdir whose run trained 5 learner steps and checkpointed: (logdir, its summary)."""
  logdir = str(tmp_path_factory.mktemp('run'))
  node = _Node(_agent(), _config(logdir, max_learner_steps=5))
  node.train()
  return logdir, node.central.summary


def _copy(logdir, tmp_path):
  """A copy of the trained logdir (each test resumes its own)."""
  import shutil  # pylint: disable=g-import-not-at-top
  target = str(tmp_path / 'run')
  shutil.copytree(logdir, target)
  return target


def test_a_resume_with_another_agent_config_stops_at_start_up_naming_the_field(
    trained, tmp_path):
  logdir = _copy(trained[0], tmp_path)
  with pytest.raises(RuntimeError, match=r'agent_config\.core') as raised:
    _Node(_agent(core='lstm'), _config(logdir, max_learner_steps=50))
  message = str(raised.value)
  assert "saved 'feedforward', now 'lstm'" in message and '--allow_config_change' in message
  assert getattr(raised.value, 'fatal', False)  # the supervisor does not restart it
  assert any('refusing to resume' in e for e in read_events(logdir))  # on the console


def test_another_seed_is_another_run(trained, tmp_path):
  logdir = _copy(trained[0], tmp_path)
  with pytest.raises(RuntimeError, match='seed: saved 0, now 3'):
    _Node(_agent(), _config(logdir, max_learner_steps=50, seed=3))


def test_an_allowed_change_resumes_and_is_recorded_and_an_incompatible_one_still_fails(
    trained, tmp_path):
  logdir = _copy(trained[0], tmp_path)
  with pytest.raises(RuntimeError, match='learning_rate'):
    _Node(_agent(learning_rate=3e-4), _config(logdir, max_learner_steps=50))
  node = _Node(_agent(learning_rate=3e-4),
               _config(logdir, max_learner_steps=50,
                       allow_config_change=('agent_config.learning_rate',)))
  try:
    assert node.central.resumed_from == trained[1]['learner_steps']
  finally:
    node.close()
  saved = json.load(open(os.path.join(logdir, 'checkpoints', 'run_config.json')))
  assert saved['config']['agent_config']['learning_rate'] == 3e-4
  assert saved['changes'][-1]['fields'] == {'agent_config.learning_rate': [1e-3, 3e-4]}
  # Allowing a change of network does not make the checkpoint fit it.
  with pytest.raises(RuntimeError, match='does not match this program'):
    _Node(_agent(core='lstm', learning_rate=3e-4),
          _config(logdir, max_learner_steps=50, allow_config_change=('agent_config.core',)))


def test_budgets_and_actor_counts_are_not_differences(trained, tmp_path):
  logdir = _copy(trained[0], tmp_path)
  node = _Node(_agent(), _config(logdir, max_learner_steps=500, max_seconds=3600,
                                 target_return=0.5, num_actors=3))
  try:
    assert node.central.resumed_from == trained[1]['learner_steps']
  finally:
    node.close()


def test_the_time_budget_counts_from_the_runs_first_start(trained, tmp_path):
  """`max_seconds` restarted with every central process: a run killed and restarted
  every 100 s never reached a 120 s budget."""
  logdir = _copy(trained[0], tmp_path)
  ran = trained[1]['run_elapsed_s'] if 'run_elapsed_s' in trained[1] else \
      trained[1]['elapsed_s']
  assert ran > 1.0
  budget = ran / 2
  node = _Node(_agent(), _config(logdir, max_seconds=budget, max_learner_steps=None))
  try:
    record = node.central.monitor.record(node.central.learner_steps, {})
    assert record['elapsed_s'] < budget  # this process has just started ...
    stop = node.central.monitor.stop_reason(record, node.central.learner_steps)
    assert stop is not None and stop.kind is StopKind.TIME  # ... the run has not
    assert record['run_elapsed_s'] >= ran
  finally:
    node.close()
  # A fresh run on a new logdir starts its clock at 0.
  fresh = _Node(_agent(), _config(str(tmp_path / 'fresh'), max_seconds=budget))
  try:
    record = fresh.central.monitor.record(0, {})
    assert record['run_elapsed_s'] < budget
    assert fresh.central.monitor.stop_reason(record, 0) is None
  finally:
    fresh.close()
