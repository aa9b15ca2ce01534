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

from seedacme.accounting import Mode
from seedacme import envs
from seedacme.actor import EnvActor
from seedacme.actor_side_inference import (POLICY_VARIABLES, ActingReports,
                                           ActorSideInference, check_report)
from seedacme.agents import registry
from seedacme.config import ProgramConfig
from seedacme.protocol import InvalidRequestError


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
    self.reports.append(report)
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


def _actor_side(setup, first_env_id, greedy=False):
  builder, spec, config, server, central = setup
  return ActorSideInference(cloudpickle.dumps((builder, spec, config)),
                            f'localhost:{server.port}', central, first_env_id,
                            config.envs_per_actor, greedy, threading.Event(),
                            report_interval_s=0.0)


def test_actor_acts_with_learner_parameters_and_writes_unrolls(setup):
  builder, spec, config, server, central = setup
  inference = _actor_side(setup, first_env_id=4)  # the second actor
  try:
    for mine, theirs in zip(inference._variables, central.network.variables):
      np.testing.assert_allclose(mine.numpy(), theirs.numpy())  # fetched at start
    fetched = central.variable_calls
    actor = EnvActor(inference, envs.make_factory('catch'), actor_id=1, num_envs=4,
                     first_env_id=4, max_steps=60, stop_event=threading.Event())
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
  inference = _actor_side(setup, first_env_id=8, greedy=True)
  try:
    EnvActor(inference, envs.make_factory('catch'), actor_id=0, num_envs=4,
             first_env_id=8, greedy=True, max_steps=25,
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
  report = {'source': 0, 'env_steps': 100, 'eval_env_steps': 10, 'batches': 4,
            'units': 64, 'full_batches': 4, 'mean_latency_ms': 2.0, 'p99_latency_ms': 3.0,
            'trajectory': {'items_written': 5},
            'train_episodes': np.array([[1.0, -1.0], [9, 9]]),
            'eval_episodes': np.zeros((2, 0))}
  report.update(overrides)
  return report


def test_acting_reports_sum_what_actors_send():
  acting = ActingReports(envs_per_actor=16)
  acting.report(_report())
  acting.report(_report(source=16, env_steps=50, batches=1, units=16, mean_latency_ms=7.0,
                        p99_latency_ms=9.0, eval_episodes=np.array([[1.0], [9]])))
  assert acting.env_steps == 150 and acting.eval_env_steps == 20
  assert acting.acting.summary(Mode.TRAIN)['episodes'] == 4
  assert acting.acting.summary(Mode.TRAIN)['average_return'] == 0.0
  assert acting.acting.summary(Mode.EVAL)['episodes'] == 1
  stats = acting.batch_stats(reset=True)
  assert stats.batches == 5 and stats.units == 80
  assert stats.mean_latency_ms == pytest.approx((4 * 2.0 + 7.0) / 5)
  assert stats.p99_latency_ms == 9.0
  assert acting.batch_stats().batches == 0  # reset
  assert acting.trajectory_stats() == {'items_written': 10}


@pytest.mark.parametrize('report, message', [
    ('not a dict', 'expects a dict'),
    ({'source': 0}, 'missing fields'),
    (_report(train_episodes=np.zeros(3)), 'train_episodes must have shape'),
])
def test_malformed_reports_are_refused_by_name(report, message):
  acting = ActingReports(envs_per_actor=4)
  with pytest.raises(InvalidRequestError, match=message):
    acting.report(report)
  assert acting.env_steps == 0
  check_report(_report())  # a good one passes


def test_central_node_of_actor_side_program_serves_no_steps():
  acting = ActingReports(envs_per_actor=4)
  with pytest.raises(InvalidRequestError, match="inference='actor'"):
    acting.step({})
  acting.shutdown()
  assert 'shutting_down' in acting.step({})


def test_actor_with_ids_outside_the_program_fails_at_once(setup):
  """A wrong request is the actor's own bug: no retrying against its own server."""
  inference = _actor_side(setup, first_env_id=8, greedy=True)
  try:
    actor = EnvActor(inference, envs.make_factory('catch'), actor_id=0, num_envs=4,
                     first_env_id=10, greedy=True, max_steps=5,
                     stop_event=threading.Event())
    with pytest.raises(InvalidRequestError, match='unknown'):
      actor.run()
  finally:
    inference.close()
