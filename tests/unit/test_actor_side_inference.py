"""Actor-side inference (inference='actor'): an actor with its own policy copy.

Real pieces throughout: the V-trace builder's network, policy and trajectory sink, an
in-process Reverb server with the builder's table, Acme's VariableClient, EnvActor on
Catch. Only the central node is replaced by an object with its two Courier methods.
"""

import threading
from concurrent import futures

import cloudpickle
import numpy as np
import pytest
import reverb
import tensorflow as tf

from seedacme import envs
from seedacme.actor.actor_side import ActorSideInference
from seedacme.actor.env_actor import EnvActor
from seedacme.agents import registry
from seedacme.config import ProgramConfig
from seedacme.nodes.central import CentralNode
from seedacme.nodes.report_intake import ReportIntake
from seedacme.run.accounting import ActingLog
from seedacme.types import Mode
from seedacme.wire.protocol import InvalidRequestError
from seedacme.wire import courier_guard
from seedacme.wire.reports import POLICY_VARIABLES, check_report


class _Central:
  """The central node's `get_variables` and `report_acting`, backed by a learner network."""

  def __init__(self, network):
    self.network = network
    self.reports = []
    self.futures = self
    self.variable_calls = 0

  def get_variables(self, names):
    assert list(names) == [POLICY_VARIABLES]
    self.variable_calls += 1
    return [[v.numpy() for v in self.network.variables]]

  def report_acting(self, report):
    self.reports.append(courier_guard.accept(report, 'report_acting'))  # as served
    future = futures.Future()
    future.set_result(None)
    return future


@pytest.fixture(name='setup')
def _setup():
  builder = registry.make_builder('vtrace', 'catch', unroll_length=5)
  spec = envs.env_spec_of(envs.make_factory('catch')(0))
  config = ProgramConfig(num_actors=2, envs_per_actor=4, num_eval_envs=4,
                         inference='actor', variable_update_period=10)
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  learner_network = builder.make_networks(spec)
  for v in learner_network.variables:  # parameters the actor cannot have by chance
    v.assign(tf.random.normal(v.shape, seed=1) + 3.0)
  central = _Central(learner_network)
  yield builder, spec, config, server, central
  server.stop()


def _actor_side(setup, first_env_id, mode=Mode.TRAIN):
  """The actor's inference and the acting log it reports from (the actor feeds it)."""
  builder, spec, config, server, central = setup
  acting = ActingLog(reporting=True)
  inference = ActorSideInference(cloudpickle.dumps((builder, spec, config)),
                                 f'localhost:{server.port}', central, first_env_id,
                                 config.envs_per_actor, mode, acting, threading.Event(),
                                 report_interval_s=0.0)
  return inference, acting


def test_actor_acts_with_learner_parameters_and_writes_unrolls(setup):
  builder, spec, config, server, central = setup
  inference, acting = _actor_side(setup, first_env_id=4)  # the second actor
  try:
    for mine, theirs in zip(inference.variables, central.network.variables):
      np.testing.assert_allclose(mine.numpy(), theirs.numpy())  # fetched at start
    fetched = central.variable_calls
    actor = EnvActor(inference, envs.make_factory('catch'), actor_id=1, num_envs=4,
                     first_env_id=4, max_steps=60, acting=acting,
                     stop_event=threading.Event())
    actor.run()
    # Every `variable_update_period` (10) calls the VariableClient fetches again.
    assert central.variable_calls >= fetched + 4
    assert inference.variable_updates >= 3
    # Unrolls of 5+1 steps from 4 envs x 60 steps reached the Reverb queue.
    info = reverb.Client(f'localhost:{server.port}').server_info()
    assert info[builder.table].current_size >= 4 * (60 // 5) - 8
    report = inference.take_report()
    reported = sum(r['env_steps'] for r in central.reports) + report['env_steps']
    assert reported == 4 * 60
    episodes = sum(r['train_episodes'].shape[1] for r in central.reports)
    assert episodes + report['train_episodes'].shape[1] == 4 * (60 // 10)
  finally:
    inference.close()


def test_evaluator_writes_nothing_and_reports_eval_episodes(setup):
  builder, _, _, server, central = setup
  inference, acting = _actor_side(setup, first_env_id=8, mode=Mode.EVAL)
  try:
    EnvActor(inference, envs.make_factory('catch'), actor_id=0, num_envs=4,
             first_env_id=8, mode=Mode.EVAL, max_steps=25, acting=acting,
             stop_event=threading.Event()).run()
    report = inference.take_report()
    reports = central.reports + [report]
    assert sum(r['eval_env_steps'] for r in reports) == 4 * 25
    assert sum(r['env_steps'] for r in reports) == 0
    assert sum(r['eval_episodes'].shape[1] for r in reports) == 4 * 2
    info = reverb.Client(f'localhost:{server.port}').server_info()
    assert info[builder.table].current_size == 0
  finally:
    inference.close()


def _report(**overrides):
  """A training actor's report (source 0: no evaluation acting; 4 batches of 4 envs)."""
  report = {'source': 0, 'env_steps': 100, 'eval_env_steps': 0, 'batches': 4,
            'units': 16, 'full_batches': 4, 'mean_latency_ms': 2.0, 'p99_latency_ms': 3.0,
            'trajectory': {'items_written': 5},
            'train_episodes': np.array([[1.0, -1.0], [9, 9]]),
            'eval_episodes': np.zeros((2, 0))}
  report.update(overrides)
  return report


def test_report_intake_sums_what_actors_send():
  log = ActingLog()
  # Two training actors of 16 envs (sources 0, 16), the evaluator's 4 (source 32).
  intake = ReportIntake(log, envs_per_actor=16, num_envs=36, num_eval_envs=4)
  intake.report(_report(units=64))
  intake.report(_report(source=16, env_steps=50, batches=1, units=16, full_batches=1,
                        mean_latency_ms=7.0, p99_latency_ms=9.0))
  intake.report(_report(source=32, env_steps=0, eval_env_steps=20, batches=0, units=0,
                        full_batches=0, trajectory={}, train_episodes=np.zeros((2, 0)),
                        eval_episodes=np.array([[1.0], [9]])))
  assert log.env_steps(Mode.TRAIN) == 150 and log.env_steps(Mode.EVAL) == 20
  assert log.summary(Mode.TRAIN)['episodes'] == 4
  assert log.summary(Mode.TRAIN)['average_return'] == 0.0
  assert log.summary(Mode.EVAL)['episodes'] == 1
  stats = intake.batch_stats(reset=True)
  assert stats.batches == 5 and stats.units == 80
  assert stats.mean_latency_ms == pytest.approx((4 * 2.0 + 7.0) / 5)
  assert stats.p99_latency_ms == 9.0
  assert intake.batch_stats().batches == 0  # reset
  assert intake.trajectory_stats() == {'items_written': 10}


def test_an_actors_reports_are_deltas_of_its_acting_log():
  log = ActingLog(reporting=True)
  log.add_steps(Mode.TRAIN, 7)
  log.add_episodes(Mode.TRAIN, envs_episodes([2.0, 4.0]))
  first = log.take_report()
  assert first.env_steps == {Mode.TRAIN: 7, Mode.EVAL: 0}
  assert first.episodes[Mode.TRAIN].returns.tolist() == [2.0, 4.0]
  log.add_steps(Mode.TRAIN, 3)
  log.add_episodes(Mode.TRAIN, envs_episodes([5.0]))
  second = log.take_report()
  assert second.env_steps[Mode.TRAIN] == 3
  assert second.episodes[Mode.TRAIN].returns.tolist() == [5.0]
  assert log.take_report().env_steps[Mode.TRAIN] == 0  # nothing new
  # The log's own totals are unchanged by reporting: the actor's account stays whole.
  assert log.env_steps(Mode.TRAIN) == 10 and log.episodes(Mode.TRAIN) == 3
  with pytest.raises(RuntimeError, match='reporting=True'):
    ActingLog().take_report()


def envs_episodes(returns):
  from seedacme.types import Episodes  # pylint: disable=g-import-not-at-top
  returns = np.asarray(returns, np.float64)
  return Episodes(np.arange(len(returns)), returns, np.full(len(returns), 5))


@pytest.mark.parametrize('report, message', [
    ('not a dict', 'expects a dict'),
    ({'source': 0}, 'missing fields'),
    (_report(train_episodes=np.zeros(3)), 'train_episodes must have shape'),
])
def test_malformed_reports_are_refused_by_name(report, message):
  log = ActingLog()
  intake = ReportIntake(log, envs_per_actor=4)
  with pytest.raises(InvalidRequestError, match=message):
    intake.report(report)
  assert log.env_steps(Mode.TRAIN) == 0
  check_report(_report())  # a good one passes


def test_central_node_of_actor_side_program_serves_no_steps(setup, tmp_path):
  builder, spec, config, server, _ = setup
  config.logdir = str(tmp_path)
  node = CentralNode(builder, spec, config, reverb.Client(f'localhost:{server.port}'),
                     stop_event=threading.Event())
  try:
    assert node.server is None and node.intake is not None
    with pytest.raises(InvalidRequestError, match="inference='actor'"):
      node.step({})
    node.report_acting(_report())
    assert node.acting.env_steps(Mode.TRAIN) == 100
  finally:
    node.shutdown()
  assert 'shutting_down' in node.step({})


def test_actor_with_ids_outside_the_program_fails_at_once(setup):
  """A wrong request is the actor's own bug: no retrying against its own server."""
  inference, _ = _actor_side(setup, first_env_id=8, mode=Mode.EVAL)
  try:
    actor = EnvActor(inference, envs.make_factory('catch'), actor_id=0, num_envs=4,
                     first_env_id=10, mode=Mode.EVAL, max_steps=5,
                     stop_event=threading.Event())
    with pytest.raises(InvalidRequestError, match='unknown'):
      actor.run()
  finally:
    inference.close()
