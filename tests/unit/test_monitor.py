"""The run monitor: typed stop reasons, budgets and targets, and the summary it writes."""

import dataclasses
import json
import os
import time

import pytest

from seedacme.run.accounting import ActingLog

from seedacme.types import Episodes, Mode
from seedacme.serving.batcher import BatcherStats
from seedacme.config import ProgramConfig
from seedacme.run.logdir import read_progress, read_summary
from seedacme.run.monitor import RunMonitor, StopKind, StopReason
import numpy as np


class _Serving:
  """A `ServingStats` with fixed batch statistics per interval."""

  def __init__(self):
    self.batch_capacity = 8
    self.actor_restarts = self.requests_refused = 0

  def batch_stats(self, reset=False):
    del reset
    return BatcherStats(batches=2, items=2, units=8, full_batches=1, mean_batch_units=4.0,
                        mean_latency_ms=1.0, p99_latency_ms=2.0)

  def trajectory_stats(self):
    return {'items_written': 3}


def _monitor(tmp_path, **config):
  config = ProgramConfig(num_actors=1, envs_per_actor=8, logdir=str(tmp_path),
                         **{'max_seconds': None, **config})
  acting = ActingLog()
  return RunMonitor(config, acting, _Serving()), acting


def _episodes(returns):
  returns = np.asarray(returns, np.float64)
  return Episodes(np.arange(len(returns)), returns, np.full(len(returns), 9))


@pytest.mark.timeout(60)
def test_target_needs_enough_episodes_and_says_by_how_much(tmp_path):
  monitor, acting = _monitor(tmp_path, target_return=0.9)
  acting.add_episodes(Mode.TRAIN, _episodes([1.0] * 99))
  assert monitor.report(0, {}) is None  # 99 < 100 episodes
  acting.add_episodes(Mode.TRAIN, _episodes([1.0]))
  reason = monitor.report(0, {})
  assert reason == StopReason(StopKind.TARGET, 1.0, 0.9)
  assert reason.sentence() == 'average return 1.000 >= target 0.9'


@pytest.mark.timeout(60)
def test_after_a_resume_the_target_waits_for_a_full_window_of_new_episodes(tmp_path):
  monitor, acting = _monitor(tmp_path, target_return=18.0)
  acting.restore(env_steps=2_960_000, episodes=2206)
  acting.add_episodes(Mode.TRAIN, _episodes([20.0] * 3))
  record = monitor.record(0, {})
  assert record['episodes'] == 2209 and record['average_over'] == 3
  assert monitor.stop_reason(record, 0) is None
  acting.add_episodes(Mode.TRAIN, _episodes([18.0] * 97))
  assert monitor.report(0, {}) == StopReason(StopKind.TARGET, 18.06, 18.0)


@pytest.mark.timeout(60)
def test_eval_target_watches_the_evaluator_only(tmp_path):
  monitor, acting = _monitor(tmp_path, target_return=0.5, target_on='eval')
  acting.add_episodes(Mode.TRAIN, _episodes([1.0] * 200))
  assert monitor.report(0, {}) is None
  acting.add_episodes(Mode.EVAL, _episodes([0.0] * 10 + [1.0] * 10))
  assert monitor.report(0, {}) == StopReason(StopKind.EVAL_TARGET, 0.5, 0.5)


@pytest.mark.timeout(60)
def test_budgets_in_order_and_the_summary_carries_the_typed_reason(tmp_path):
  monitor, acting = _monitor(tmp_path, max_learner_steps=10, max_env_steps=100)
  acting.add_steps(Mode.TRAIN, 100)
  assert monitor.report(9, {}).kind is StopKind.ENV_STEPS
  reason = monitor.report(10, {'loss': 0.5})
  assert reason == StopReason(StopKind.LEARNER_STEPS, 10, 10)
  final = monitor.summarize(10, {'loss': 0.5}, reason, resumed_from=None)
  summary = read_summary(str(tmp_path))
  assert summary['env_steps'] == final['env_steps'] == 100
  assert summary['average_return'] is None  # no episodes yet: NaN is written as null
  assert summary['stopped_because'] == 'reached 10 learner steps'
  assert summary['stop'] == {'kind': 'learner_steps', 'value': 10, 'threshold': 10}
  assert summary['learner_loss'] == 0.5 and summary['trajectory_items_written'] == 3
  assert [r['learner_steps'] for r in read_progress(str(tmp_path))] == [9, 10]
  assert os.path.exists(os.path.join(tmp_path, 'progress.jsonl'))


def test_stop_without_a_budget_is_not_a_budget():
  assert StopReason(StopKind.STOP_REQUESTED).sentence() == 'stop requested'
  assert not StopReason(StopKind.LEARNER_FAILED).is_budget
  assert StopReason(StopKind.TIME, 90.2, 90.0).sentence() == 'reached the time budget of 90s'


@pytest.mark.timeout(60)
def test_the_summary_covers_the_steady_window_not_the_last_interval(tmp_path, monkeypatch):
  """Rates from the first to the last progress record, batch stats over every interval
  (each record resets the interval's): not the shutdown window's."""
  clock = [100.0]
  monkeypatch.setattr(time, 'monotonic', lambda: clock[0])
  monitor, acting = _monitor(tmp_path)
  clock[0] += 30.0  # start-up: imports, compiling; few steps
  acting.add_steps(Mode.TRAIN, 10)
  monitor.report(0, {})  # the first record starts the steady window
  for _ in range(4):  # 4 intervals of 5 s at 1,000 env steps/s and 2 learner steps/s
    clock[0] += 5.0
    acting.add_steps(Mode.TRAIN, 5000)
    monitor.report(monitor.last_record['learner_steps'] + 10, {})
  clock[0] += 2.0  # shutdown: a slow window with a few steps
  acting.add_steps(Mode.TRAIN, 20)
  final = monitor.summarize(40, {}, StopReason(StopKind.STOP_REQUESTED), None)
  assert final['env_steps'] == 20030
  assert final['env_steps_per_s'] == pytest.approx(1000.0)
  assert final['learner_steps_per_s'] == pytest.approx(2.0)
  assert final['steady_window_s'] == pytest.approx(20.0)
  # 5 records + the summary's own read, 2 batches of 4 units each.
  assert final['inference_batches'] == 12 and final['batch_fill'] == 0.5
  assert read_summary(str(tmp_path))['env_steps_per_s'] == pytest.approx(1000.0)


@pytest.mark.timeout(60)
def test_one_definition_of_the_learner_budget(tmp_path):
  monitor, _ = _monitor(tmp_path, max_learner_steps=5)
  assert monitor.learner_budget(4) is None
  assert monitor.learner_budget(5) == StopReason(StopKind.LEARNER_STEPS, 5, 5)
  assert monitor.stop_reason({'env_steps': 0, 'elapsed_s': 0.0}, 5) == \
      monitor.learner_budget(5)
  unlimited, _ = _monitor(tmp_path)
  assert unlimited.learner_budget(10**9) is None


def test_the_time_budget_counts_over_every_start_of_the_run(tmp_path):
  """`max_seconds` restarted with every central process (a restarted or resumed node
  started its clock at 0); the run's clock in the logdir now carries it on."""
  first, _ = _monitor(tmp_path, max_seconds=0.5)
  first.restart_clock(0)
  time.sleep(0.35)
  assert first.report(0, {}) is None
  clock = json.load(open(os.path.join(str(tmp_path), 'run_clock.json')))
  assert clock['elapsed_s'] >= 0.35 and clock['starts'] == 1

  resumed, _ = _monitor(tmp_path, max_seconds=0.5)  # the restarted central process
  resumed.restart_clock(0, resumed=True)
  time.sleep(0.2)
  stop = resumed.report(0, {})
  assert stop is not None and stop.kind is StopKind.TIME and stop.value >= 0.55
  assert resumed.last_record['elapsed_s'] < 0.5 <= resumed.last_record['run_elapsed_s']
  assert json.load(open(os.path.join(str(tmp_path), 'run_clock.json')))['starts'] == 2

  fresh, _ = _monitor(tmp_path, max_seconds=0.5)  # not a resume: a new run's clock
  fresh.restart_clock(0)
  time.sleep(0.2)
  assert fresh.report(0, {}) is None


def test_a_named_budget_replaces_the_default_time_budget_in_the_config(tmp_path):
  monitor, _ = _monitor(tmp_path, max_seconds=None, max_env_steps=1000)
  assert monitor.stop_reason({'env_steps': 10, 'elapsed_s': 1e4}, 0) is None
  monitor, _ = _monitor(tmp_path, max_seconds=None)  # no budget: the default applies
  assert monitor.stop_reason({'env_steps': 10, 'elapsed_s': 121.0}, 0).kind is StopKind.TIME


@pytest.mark.timeout(60)
def test_records_say_how_many_actors_serve_and_the_summary_each_ones_transport(tmp_path):
  from seedacme.run.contacts import EnvContacts  # pylint: disable=g-import-not-at-top
  from seedacme.run.progress import format_line  # pylint: disable=g-import-not-at-top
  config = ProgramConfig(num_actors=3, envs_per_actor=4, num_eval_envs=2,
                         logdir=str(tmp_path), max_seconds=None, progress_interval_s=5.0)
  serving = _Serving()
  serving.contacts = EnvContacts(config.num_envs)
  monitor = RunMonitor(config, ActingLog(), serving)
  now = time.monotonic()
  serving.contacts.mark(range(0, 4), 'shm', now)  # actor/0 on the central node's host
  serving.contacts.mark(np.array([4, 5]), 'courier', now)  # half of actor/1's envs
  serving.contacts.mark(range(8, 12), 'courier', now - 30)  # actor/2: gone 30 s ago
  serving.contacts.mark(range(12, 14), 'courier', now)  # the evaluator
  monitor.report(5, {})  # the learner has stepped since the monitor's start
  record = read_progress(str(tmp_path))[-1]
  assert (record['actors'], record['actors_serving'], record['actors_shm'],
          record['actors_courier'], record['evaluator_serving']) == (3, 2, 1, 1, 1)
  assert 'transports' not in record and record['learner_stepped'] is True
  assert '| actors 2/3 acting |' in format_line(record)
  summary = monitor.summarize(0, {}, StopReason(StopKind.STOP_REQUESTED), None)
  assert summary['transports'] == {'actor/0': 'shm', 'actor/1': 'courier',
                                   'actor/2': 'courier', 'evaluator/0': 'courier'}
  assert read_summary(str(tmp_path))['actors_serving'] == 2
  # A monitor whose serving side keeps no contacts says nothing about actors.
  plain, _ = _monitor(tmp_path / 'plain')
  plain.report(0, {})
  assert 'actors' not in read_progress(str(tmp_path / 'plain'))[-1]


def test_actors_idle_before_the_learners_first_step_read_as_start_up(tmp_path):
  from seedacme.run.contacts import EnvContacts  # pylint: disable=g-import-not-at-top
  from seedacme.run.progress import format_line  # pylint: disable=g-import-not-at-top
  config = ProgramConfig(num_actors=2, envs_per_actor=4, logdir=str(tmp_path),
                         max_seconds=None, progress_interval_s=5.0)
  serving = _Serving()
  serving.contacts = EnvContacts(config.num_envs)
  monitor = RunMonitor(config, ActingLog(), serving)
  monitor.restart_clock(100, resumed=False)  # e.g. restored at learner step 100
  first = monitor.record(100, {})  # no actor heard from, the learner not stepped
  assert first['learner_stepped'] is False
  line = format_line(first)
  assert "actors 0/2 acting (start-up, before the learner's first step)" in line
  assert 'serving' not in line
  serving.contacts.mark(range(0, 8), 'shm')
  stepped = monitor.record(101, {})
  assert stepped['learner_stepped'] is True
  assert '| actors 2/2 acting |' in format_line(stepped)
  serving.contacts.mark(range(4, 8), 'shm', time.monotonic() - 60)  # actor/1 gone
  assert format_line(monitor.record(102, {})).count('actors 1/2 acting |') == 1
  # Acting only: no learner to wait for, so no start-up note and no field.
  acting_only = RunMonitor(dataclasses.replace(config, train=False), ActingLog(), serving)
  record = acting_only.record(0, {})
  assert 'learner_stepped' not in record and 'start-up' not in format_line(record)
