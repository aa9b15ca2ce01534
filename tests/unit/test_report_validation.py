"""What an actor may report, and what may ask for variables (issue 62, item 5).

`report_acting` is summed into a run's progress, budgets and targets, so every field
is checked before anything is stored (`seedacme.wire.reports.check_report`), against
the program's sources and a rate bound per source (`ReportIntake`). Here: the issue's
report (a string among the trajectory counters, which ended the central node in its
next progress record) refused by name while the monitor records on; every field wrong
in turn; per-source state bounded by the program's actors; figures no actor of the
program can send; a real actor's and evaluator's reports all accepted; `get_variables`
and `step` requests bounded, with short refusals. The same calls over Courier against a
real central node: tests/unit/test_courier_fuzz.py.
"""

import os
import threading
from concurrent import futures

import cloudpickle
import numpy as np
import pytest

from seedacme.config import ProgramConfig
from seedacme.nodes.report_intake import ReportIntake
from seedacme.run.accounting import ActingLog
from seedacme.run.monitor import RunMonitor
from seedacme.types import EnvSpec, Mode
from seedacme.wire import courier_guard
from seedacme.wire.protocol import InvalidRequestError, validate_request
from seedacme.wire.reports import (BURST_S, MAX_ENV_STEPS_PER_S, TRAJECTORY_STATS,
                                   check_variable_names)
from tests.unit.courier_fuzzing import bad_reports, good_report, good_step


def _intake(acting=None, **kwargs):
  """The intake of the fuzz server's actor-side program: one actor of 2 envs (source
  0), an evaluator of 2 (source 2); Catch's spec, reward bound 1e6."""
  kwargs.setdefault('max_abs_reward', 1e6)
  return ReportIntake(acting or ActingLog(), 2, num_envs=4, num_eval_envs=2, **kwargs)


def test_the_issues_report_is_refused_and_the_monitor_records_on(tmp_path):
  acting = ActingLog()
  intake = ReportIntake(acting, 2, num_envs=2)
  monitor = RunMonitor(ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0,
                                     logdir=str(tmp_path), max_seconds=None),
                       acting, intake)
  intake.report(good_report())
  with pytest.raises(InvalidRequestError, match=r'report_acting: trajectory\[.items_written.\]'):
    intake.report(good_report(trajectory={'items_written': 'many'}))
  record = monitor.record(0, {})  # on c8a4f53: TypeError, and the node died
  assert record['trajectory_items_written'] == 3 and record['env_steps'] == 20
  assert record['requests_refused'] == 1


@pytest.mark.parametrize('field, report', bad_reports(),
                         ids=[f'{i}-{f}' for i, (f, _) in enumerate(bad_reports())])
def test_each_wrong_field_is_refused_by_name_and_nothing_is_kept(field, report):
  acting = ActingLog()
  intake = _intake(acting)
  with pytest.raises(InvalidRequestError) as error:
    intake.report(courier_guard.accept(courier_guard.plain(report), 'report_acting'))
  assert field in str(error.value)
  assert acting.env_steps(Mode.TRAIN) == 0 and acting.episodes(Mode.TRAIN) == 0
  assert intake.batch_stats().batches == 0 and intake.trajectory_stats() == {}
  intake.report(good_report())  # the same intake takes a good one
  assert acting.env_steps(Mode.TRAIN) == 20


def test_only_the_programs_sources_are_kept():
  intake = _intake()
  for source in (1, 3, 4, 6, 1000, 2**31 - 1):
    with pytest.raises(InvalidRequestError, match=f'source {source} is no actor'):
      intake.report(good_report(source=source))
  intake.report(good_report())  # actor 0
  intake.report(good_report(source=2, env_steps=0, eval_env_steps=20, trajectory={},
                            train_episodes=np.zeros((2, 0)),
                            eval_episodes=np.array([[1.0], [9.0]])))  # the evaluator
  assert intake.trajectory_stats()['items_written'] == 3  # one source's counters
  assert set(intake._trajectory) <= {0, 2}  # pylint: disable=protected-access
  # A report of env faults alone may name an actor's index; nothing is kept of it.
  intake.report(good_report(source=1, batches=0, units=0, full_batches=0, env_steps=0,
                            trajectory={}, train_episodes=np.zeros((2, 0))))
  assert set(intake._trajectory) <= {0, 2}  # pylint: disable=protected-access


def test_env_steps_are_bounded_by_what_the_sources_envs_can_step():
  now = [100.0]
  acting = ActingLog()
  intake = _intake(acting, clock=lambda: now[0])
  burst = int(2 * MAX_ENV_STEPS_PER_S * BURST_S)  # 2 envs
  with pytest.raises(InvalidRequestError, match='env_steps 1000000000 from source 0'):
    intake.report(good_report(env_steps=10**9))
  intake.report(good_report(env_steps=burst))
  with pytest.raises(InvalidRequestError, match='env_steps 20 from source 0 exceed'):
    intake.report(good_report())  # the bucket is empty
  now[0] += 1.0  # one second refills 2 envs x MAX_ENV_STEPS_PER_S
  intake.report(good_report(env_steps=2 * MAX_ENV_STEPS_PER_S))
  with pytest.raises(InvalidRequestError, match='env_steps'):
    intake.report(good_report())
  # The evaluator's bucket is its own.
  intake.report(good_report(source=2, env_steps=0, eval_env_steps=20, trajectory={},
                            train_episodes=np.zeros((2, 0))))
  assert acting.env_steps(Mode.TRAIN) == burst + 2 * MAX_ENV_STEPS_PER_S


def test_figures_no_actor_can_send_are_refused():
  intake = _intake(max_abs_reward=1.0)  # e.g. Catch's rewards, |r| <= 1
  episodes = np.array([[9.0, -9.0], [9.0, 9.0]])
  intake.report(good_report(train_episodes=episodes))  # at the bound
  for returns, field in ((10.0, 'train_episodes return 10 '), (1e9, r'return 1e\+09')):
    with pytest.raises(InvalidRequestError, match=field):
      intake.report(good_report(train_episodes=np.array([[returns], [9.0]])))
  # Evaluation acting from a training source, or training acting from the evaluator.
  with pytest.raises(InvalidRequestError, match='eval_env_steps must be 0 from source 0'):
    intake.report(good_report(eval_env_steps=5))
  with pytest.raises(InvalidRequestError, match='env_steps must be 0 from source 2'):
    intake.report(good_report(source=2))
  # More episodes than env steps (one per env more), more units than batches hold.
  with pytest.raises(InvalidRequestError, match='train_episodes has 23 episodes'):
    intake.report(good_report(train_episodes=np.ones((2, 23))))
  intake.report(good_report(train_episodes=np.ones((2, 22))))
  with pytest.raises(InvalidRequestError, match='units 21'):
    intake.report(good_report(units=21))


def test_a_central_inference_intake_takes_env_faults_only():
  intake = _intake(faults_only=True)
  with pytest.raises(InvalidRequestError, match='env faults only'):
    intake.report(good_report())
  with pytest.raises(InvalidRequestError, match='env faults only'):
    intake.report(good_report(batches=0, units=0, full_batches=0, env_steps=0,
                              train_episodes=np.zeros((2, 0))))  # trajectory counters


def test_get_variables_names_are_bounded():
  assert check_variable_names(['policy']) == ['policy']
  assert check_variable_names(('policy',)) == ['policy']
  for names, message in ((['policy'] * 1000, r'names must hold 1 to 1 .* got 1000'),
                         ('policy', 'names must be a list'), ([], 'got 0'),
                         ([b'policy'], r'names\[0\] must be a string'),
                         (['x' * 100_000], r'names\[0\] must be a string of at most 64'),
                         (['bogus'], r"names\[0\] 'bogus' is unknown")):
    with pytest.raises(InvalidRequestError, match=message) as error:
      check_variable_names(names)
    assert len(str(error.value)) < 300


def test_a_step_with_more_envs_than_the_server_is_refused_briefly():
  spec = EnvSpec((10, 5), 'float32', 3)
  for k in (3, 4000):
    request = good_step(k)
    with pytest.raises(InvalidRequestError, match=f'request has {k} envs \\(env_ids\\); '
                       'this server has 2') as error:
      validate_request(request, spec, num_envs=2, max_request_envs=4096)
    assert len(str(error.value)) < 200
  # 2,000 unknown env ids of 3,000: the refusal shows 16.
  request = good_step(3000)
  request['ids'][0] += 3000
  with pytest.raises(InvalidRequestError, match=r'env_ids \[4000, 4001, .*, 4015, \.\.\.\] '
                     r'\(2000 in all\) are unknown') as error:
    validate_request(request, spec, num_envs=4000, max_request_envs=4096)
  assert len(str(error.value)) < 300


def test_shm_offers_pid_is_refused_by_name():
  from seedacme.serving.policy import PolicyStep, StatelessPolicy  # pylint: disable=g-import-not-at-top
  from seedacme.serving.server import InferenceServer  # pylint: disable=g-import-not-at-top
  from seedacme.serving.shm_server import ShmServer  # pylint: disable=g-import-not-at-top

  class Zeros(StatelessPolicy):
    def act(self, observation, eval_mask, env_ids):
      return PolicyStep(np.zeros(len(observation), np.int32), {}, ())

  spec = EnvSpec((3,), 'float32', 2)
  server = InferenceServer(Zeros(4), spec, 4, None)
  shm_server = ShmServer(server, spec, 4)
  try:
    for pid in ('1', 1.0, True, None.__class__, 0, -5, 2**40, 10**5000, [1]):
      with pytest.raises(InvalidRequestError, match='shm_offer: pid must be an int') as e:
        shm_server.offer(pid)
      assert len(str(e.value)) < 100
    assert shm_server.offer(os.getpid())['ticket']
  finally:
    shm_server.close()
    server.close()


class _Central:
  """An actor's central node: `get_variables` from a network, `report_acting` into a
  real intake (over seedacme's wire encoding), refusals kept."""

  def __init__(self, network, intake):
    self.network, self.intake = network, intake
    self.futures = self
    self.refused, self.trajectory_keys = [], set()

  def get_variables(self, names):
    check_variable_names(names)
    return [[v.numpy() for v in self.network.variables]]

  def report_acting(self, report):
    report = courier_guard.accept(courier_guard.plain(report), 'report_acting')
    self.trajectory_keys |= set(report['trajectory'])
    try:
      self.intake.report(report)
    except InvalidRequestError as e:
      self.refused.append(str(e))
      raise
    done = futures.Future()
    done.set_result(None)
    return done


@pytest.mark.timeout(180)
def test_a_real_actors_and_evaluators_reports_all_pass():
  import reverb  # pylint: disable=g-import-not-at-top
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.actor.actor_side import ActorSideInference  # pylint: disable=g-import-not-at-top
  from seedacme.actor.env_actor import EnvActor  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  builder = registry.make_builder('vtrace', 'catch', unroll_length=5)
  spec = envs.env_spec_of(envs.make_factory('catch')(0))
  config = ProgramConfig(num_actors=2, envs_per_actor=4, num_eval_envs=4,
                         inference='actor', variable_update_period=10)
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  acting = ActingLog()
  central = _Central(builder.make_networks(spec),
                     ReportIntake(acting, 4, num_envs=12, num_eval_envs=4,
                                  max_abs_reward=spec.max_abs_reward))
  try:
    for first, mode, steps in ((4, Mode.TRAIN, 60), (8, Mode.EVAL, 25)):
      own = ActingLog(reporting=True)
      inference = ActorSideInference(  # a report after every call: the smallest deltas
          cloudpickle.dumps((builder, spec, config)), f'localhost:{server.port}', central,
          first, 4, mode, own, threading.Event(), report_interval_s=0.0)
      try:
        EnvActor(inference, envs.make_factory('catch'), actor_id=first // 4, num_envs=4,
                 first_env_id=first, mode=mode, max_steps=steps, acting=own,
                 stop_event=threading.Event()).run()
        central.report_acting(inference.take_report())  # as the actor does at its end
      finally:
        inference.close()
  finally:
    server.stop()
  assert not central.refused, central.refused[:3]
  assert acting.env_steps(Mode.TRAIN) == 4 * 60 and acting.env_steps(Mode.EVAL) == 4 * 25
  assert acting.episodes(Mode.TRAIN) == 4 * 6 and acting.episodes(Mode.EVAL) == 4 * 2
  assert central.trajectory_keys == set(TRAJECTORY_STATS)  # the sink's counters, all known
