"""An env that raises or hangs, in a real supervised actor process: reported by name to
the central node's report intake (logged and counted), the actor child exits with a
named code and its supervisor restarts it on new, reproducible seeds.

The central node is a stub served over Courier in this process: `step` answers every
env with action 0 and `report_acting` goes to a real `ReportIntake` (faults only, as
with central inference). The actor is the real entry point (`run_actor`) under the
real `Supervisor`.
"""

import os
import threading

import numpy as np
import portpicker
import pytest

from seedacme.actor.env_actor import EnvActor, env_seed, run_actor
from seedacme.nodes.report_intake import ReportIntake
from seedacme.run.accounting import ActingLog
from seedacme.runtime.supervisor import Supervisor
from seedacme.wire import courier_guard, reports
from seedacme.wire.protocol import InvalidRequestError, fields

BASE_SEED = 100
FIRST_ENV_ID = 8


def _faulty_catch_factory(directory: str, fault: str, bad_seed: int):
  """Catch whose env seeded `bad_seed` raises (or hangs) at its 3rd step; every env
  made writes its seed to `directory/<pid>` (sent by value to the actor child)."""
  from seedacme import envs  # pylint: disable=g-import-not-at-top

  class FaultyCatch:

    def __init__(self, seed):
      self._env = envs.make_factory('catch')(seed)
      self._seed, self._steps = seed, 0
      with open(os.path.join(directory, str(os.getpid())), 'a') as f:
        f.write(f'{seed}\n')

    def __getattr__(self, name):
      return getattr(self._env, name)

    def step(self, action):
      self._steps += 1
      if self._seed == bad_seed and self._steps == 3:
        if fault == 'raise':
          raise ValueError('the emulator lost its ROM')
        threading.Event().wait(600)  # hangs
      return self._env.step(action)

  return FaultyCatch


class _StubCentral:
  """What an actor calls on the central node: `step` and `report_acting`."""

  def __init__(self):
    self.acting = ActingLog()
    self.intake = ReportIntake(self.acting, 2, faults_only=True)
    self.reports = []

  def step(self, request):
    return {'action': np.zeros(len(fields(request)['env_ids']), np.int32)}

  def report_acting(self, report):
    self.intake.report(report)
    self.reports.append(report)


@pytest.fixture
def central():
  import courier  # pylint: disable=g-import-not-at-top
  stub = _StubCentral()
  port = portpicker.pick_unused_port()
  server = courier.Server(port=port)
  server.Bind('step', courier_guard.served(stub.step, 'step'))  # seedacme's wire
  server.Bind('report_acting', courier_guard.served(stub.report_acting, 'report_acting'))
  server.Start()
  stub.address = f'localhost:{port}'
  yield stub
  server.Stop()
  server.Join()


def _seeds(directory):
  """Seeds each child made its envs with, by child (in start order)."""
  paths = sorted(os.listdir(directory), key=lambda p: os.stat(os.path.join(directory, p)).st_mtime)
  return [[int(s) for s in open(os.path.join(directory, p)).read().split()] for p in paths]


@pytest.mark.parametrize('fault', ['raise', 'hang'])
@pytest.mark.timeout(120)
def test_a_faulty_env_is_reported_and_its_actor_restarts_on_new_seeds(
    fault, central, tmp_path, wait_until):
  import courier  # pylint: disable=g-import-not-at-top
  bad_seed = BASE_SEED + 1  # the actor's second env: global env id FIRST_ENV_ID + 1
  stop = threading.Event()
  sup = Supervisor(run_actor, dict(
      inference=courier.Client(central.address), transport='courier',
      env_factory=_faulty_catch_factory(str(tmp_path), fault, bad_seed), actor_id=4,
      num_envs=2, first_env_id=FIRST_ENV_ID, seed=BASE_SEED, env_step_timeout_s=1.5),
      'actor/4', stop_event=stop, restart_backoff_s=0.1)
  thread = threading.Thread(target=sup.run)
  thread.start()
  try:
    # The restarted child made its envs, and stepped them past the faulty step.
    assert wait_until(lambda: len(_seeds(tmp_path)) == 2 and sup.child is not None
                      and sup.restarts == 1, 60)
    assert wait_until(lambda: central.acting.env_fault_counts() ==
                      {'env_faults_raised': int(fault == 'raise'),
                       'env_faults_hung': int(fault == 'hang')}, 30)
    first_child = sup.child
    assert not wait_until(lambda: sup.restarts > 1 or first_child.poll() is not None, 3)
  finally:
    stop.set()
    thread.join(30)
  assert not thread.is_alive() and sup.child.poll() is not None
  seeds = _seeds(tmp_path)
  restarted = env_seed(BASE_SEED, 1)
  assert seeds == [[BASE_SEED, BASE_SEED + 1], [restarted, restarted + 1]]
  assert restarted != BASE_SEED and restarted == env_seed(BASE_SEED, 1)  # reproducible
  [report] = central.reports
  [got] = report['env_faults']
  assert got['kind'] == {'raise': 'raised', 'hang': 'hung'}[fault]
  assert got['actor'] == 'actor 4' and got['seed'] == bad_seed
  assert got['env_ids'] == [FIRST_ENV_ID + 1]
  assert got['env_name'].startswith('FaultyCatch')
  if fault == 'raise':
    assert (got['error_type'], got['message']) == ('ValueError', 'the emulator lost its ROM')
  else:
    assert got['error_type'] == 'EnvStepTimeout' and 'after 2s' in got['message']


def test_env_faults_are_logged_by_name_and_counted(caplog):
  acting = ActingLog()
  intake = ReportIntake(acting, 2)
  fault = reports.env_fault('raised', 'actor 1', 'AtariEnv (Pong)', [3], 'RuntimeError',
                            'ALE died', 7)
  report = reports.fault_report(1, [fault])
  with caplog.at_level('ERROR', logger='absl'):
    intake.report(report)
  assert acting.env_fault_counts() == {'env_faults_raised': 1, 'env_faults_hung': 0}
  [line] = [r.getMessage() for r in caplog.records if 'Env fault' in r.getMessage()]
  assert 'AtariEnv (Pong)' in line and '[3]' in line and 'RuntimeError' in line \
      and 'ALE died' in line and 'actor 1' in line
  # Central inference takes faults only (its server counts acting itself).
  faults_only = ReportIntake(ActingLog(), 2, faults_only=True)
  faults_only.report(report)
  with pytest.raises(InvalidRequestError, match='env faults only'):
    faults_only.report(dict(report, env_steps=5))
  # What a caller may send is bounded and typed.
  for bad in ([dict(fault, kind='exploded')], [dict(fault, message='x' * 10_000)],
              [dict(fault, env_ids=['1'])], [fault] * 100, [dict(fault, extra=1)]):
    with pytest.raises(InvalidRequestError):
      intake.report(dict(report, env_faults=bad))


def test_env_seed_is_the_base_seed_first_then_distinct_per_restart():
  assert env_seed(5, 0) == 5
  seeds = {env_seed(5, r) for r in range(1, 50)}
  assert len(seeds) == 49 and 5 not in seeds
  assert all(0 <= s < 2**31 - 2**16 for s in seeds)
  assert env_seed(5, 3) == env_seed(5, 3) != env_seed(6, 3)


def test_an_unsupervised_actor_raises_the_env_fault():
  from seedacme import envs  # pylint: disable=g-import-not-at-top

  class Broken:
    def __init__(self, seed):
      self._env = envs.make_factory('catch')(seed)

    def __getattr__(self, name):
      return getattr(self._env, name)

    def reset(self):
      raise OSError('no display')

  class Client:
    def __init__(self):
      self.futures = self
      self.reports = []

    def report_acting(self, report):
      from concurrent import futures  # pylint: disable=g-import-not-at-top
      self.reports.append(report)
      done = futures.Future()
      done.set_result(None)
      return done

  client = Client()
  actor = EnvActor(client, Broken, actor_id=0, num_envs=2, first_env_id=0,
                   transport='courier', stop_event=threading.Event())
  with pytest.raises(RuntimeError, match=r'env Broken .*ids \[0\].*OSError: no display'):
    actor.run()
  assert [f['env_ids'] for r in client.reports for f in r['env_faults']] == [[0]]


def test_the_summary_counts_env_faults(tmp_path):
  from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
  from seedacme.run.logdir import read_summary  # pylint: disable=g-import-not-at-top
  from seedacme.run.monitor import RunMonitor, StopKind, StopReason  # pylint: disable=g-import-not-at-top
  acting = ActingLog()
  intake = ReportIntake(acting, 2)
  monitor = RunMonitor(ProgramConfig(num_actors=1, envs_per_actor=2, logdir=str(tmp_path),
                                     max_seconds=None), acting, intake)
  for kind in ('raised', 'hung', 'hung'):
    intake.report(reports.fault_report(0, [reports.env_fault(
        kind, 'actor 0', 'Catch', [1], 'E', 'm', 1)]))
  monitor.summarize(0, {}, StopReason(StopKind.STOP_REQUESTED), None)
  summary = read_summary(str(tmp_path))
  assert (summary['env_faults_raised'], summary['env_faults_hung']) == (1, 2)


def test_the_program_gives_every_actor_the_configured_step_limit():
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.agents import vtrace  # pylint: disable=g-import-not-at-top
  from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top
  factory = envs.make_factory('catch')
  for supervise in (True, False):
    config = ProgramConfig(num_actors=2, envs_per_actor=2, num_eval_envs=2,
                           env_step_timeout_s=7.0, supervise=supervise)
    program = program_lib.make_program(vtrace.VTraceBuilder(vtrace.VTraceConfig()), factory,
                                       envs.env_spec_of(factory(0)), config)
    nodes = program.groups['actor'] + program.groups['evaluator']
    # PyNode (supervised) or PyClassNode (EnvActor itself): the kwargs the work gets.
    kwargs = [getattr(n, '_func_kwargs', None) or n._kwargs for n in nodes]  # pylint: disable=protected-access
    assert [k['env_step_timeout_s'] for k in kwargs] == [7.0] * 3
  with pytest.raises(ValueError, match='env_step_timeout_s'):
    ProgramConfig(env_step_timeout_s=0).validate()
