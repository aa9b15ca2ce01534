"""Fixtures shared by unit tests (pytest finds this file; Bazel ships it with each test)."""

import tempfile
import threading
import time

import pytest
import reverb

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.nodes.central import CentralNode
from tests.unit.in_process import InProcessActor


def _wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
  """Polls `predicate` until it holds (True) or `timeout_s` passes (False)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(interval_s)
  return False


@pytest.fixture(autouse=True, scope='session')
def _reverb_checkpoint_dirs_under_pytest(tmp_path_factory):
  """Reverb's default checkpointer makes a /tmp/tmpXXXX dir per server and never removes
  it (~70 per suite run, left in /tmp for good): the servers tests make keep theirs under
  pytest's temp dir, which pytest prunes. (The replay node removes its own.)"""
  from reverb.platform.default import checkpointers  # pylint: disable=g-import-not-at-top
  base = str(tmp_path_factory.mktemp('reverb_checkpoints'))
  original = checkpointers.default_checkpointer
  checkpointers.default_checkpointer = lambda group=None: checkpointers.DefaultCheckpointer(
      tempfile.mkdtemp(dir=base))
  yield
  checkpointers.default_checkpointer = original


@pytest.fixture
def wait_until():
  """`wait_until(predicate, timeout_s=30, interval_s=0.05) -> bool`: polls a condition."""
  return _wait_until


@pytest.fixture
def make_central(tmp_path):
  """`make_central(agent_config, env, num_actors, envs_per_actor)`: a real central node
  (Reverb server, inference server, learner) in this process with `InProcessActor`s
  calling it; everything stops at teardown."""
  created = []

  def make(agent_config, env='catch', num_actors=2, envs_per_actor=8, actor=None,
           env_options=None, **config_kwargs):
    """`agent_config`: a VTraceConfig, or any builder; `actor`: the actor class
    (default `InProcessActor`); `env_options`: the env's (e.g. a MuJoCo level);
    `config_kwargs`: ProgramConfig fields over the defaults here (logdir: the test's
    tmp dir; no evaluator, no time budget)."""
    factory = envs.make_factory(env, **(env_options or {}))
    spec = envs.env_spec_of(factory(0))
    builder = (vtrace.VTraceBuilder(agent_config)
               if isinstance(agent_config, vtrace.VTraceConfig) else agent_config)
    server = reverb.Server(builder.make_replay_tables(spec), port=None)
    client = reverb.Client(f'localhost:{server.port}')
    fields = dict(num_actors=num_actors, envs_per_actor=envs_per_actor, num_eval_envs=0,
                  logdir=str(tmp_path), max_seconds=None)
    fields.update(config_kwargs)
    config = ProgramConfig(**fields)
    stop = threading.Event()
    central = CentralNode(builder, spec, config, client, stop_event=stop)
    actors = [(actor or InProcessActor)(central, factory, i * envs_per_actor,
                                        envs_per_actor, stop)
              for i in range(num_actors)]
    created.append((server, central, actors, stop))
    return central, client, actors, builder.table

  yield make
  for server, central, actors, stop in created:
    stop.set()
    central.shutdown()
    for a in actors:
      a.join(5)
    server.stop()


def _learn_until(central, target: float, first_after_episodes: int, timeout_s: float):
  """Steps `central`'s learner until the training average reaches `target` (or time
  runs out); returns (the average once `first_after_episodes` episodes had ended, the
  last acting summary): a returns-rise test asserts last >= target > first."""
  from seedacme.types import Mode  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + timeout_s
  first, summary = None, {}
  while time.monotonic() < deadline:
    central.learner.step()
    summary = central.server.acting.summary(Mode.TRAIN)
    if first is None and summary['episodes'] >= first_after_episodes:
      first = summary['average_return']
    if first is not None and summary['average_return'] >= target:
      break
  return first, summary


@pytest.fixture
def learn_until():
  """`learn_until(central, target, first_after_episodes, timeout_s) -> (first, summary)`:
  steps a central node's learner until returns reach `target`."""
  return _learn_until


def _wait_until_stalled(actor, still_s: float = 2.0, timeout_s: float = 60.0) -> bool:
  """Waits until `actor` (an `InProcessActor`) made no step for `still_s`; False if it
  never stalled within `timeout_s` (a rate limiter that did not hold it back)."""
  deadline = time.monotonic() + timeout_s
  last, still_since = -1, time.monotonic()
  while time.monotonic() < deadline:
    if actor.steps != last:
      last, still_since = actor.steps, time.monotonic()
    elif time.monotonic() - still_since > still_s:
      return True
    time.sleep(0.05)
  return False


@pytest.fixture
def wait_until_stalled():
  """`wait_until_stalled(actor, still_s=2, timeout_s=60) -> bool`."""
  return _wait_until_stalled
