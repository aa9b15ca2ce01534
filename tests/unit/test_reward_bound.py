"""A reward bound the config can set: `ProgramConfig.max_abs_reward` (`--max_abs_reward`)
replaces the env spec's bound on the central node, which refuses a request past it by
name; the flag and the env-step watchdog's flag reach the config."""

import argparse
import threading

import numpy as np
import pytest
import reverb

from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.launchers import program_flags
from seedacme.nodes.central import CentralNode
from seedacme.wire.protocol import InvalidRequestError, make_request


@pytest.mark.timeout(120)
def test_the_configs_reward_bound_replaces_the_env_specs(tmp_path):
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  assert spec.max_abs_reward == 1e6
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                     hidden_sizes=(16,)))
  replay = reverb.Server(builder.make_replay_tables(spec), port=None)
  config = ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0,
                         logdir=str(tmp_path), checkpoint_interval_s=None,
                         transport='courier', max_abs_reward=5.0)
  node = CentralNode(builder, spec, config, reverb.Client(f'localhost:{replay.port}'),
                     stop_event=threading.Event())
  try:
    obs = np.stack([factory(0).reset().observation] * 2)
    first = make_request(np.arange(2), np.ones(2, np.int64), obs, np.zeros(2), np.ones(2),
                         np.zeros(2))
    assert node.step(first)['action'].shape == (2,)
    within = make_request(np.arange(2), np.ones(2, np.int64), obs, np.array([5.0, -5.0]),
                          np.ones(2), np.ones(2))
    assert node.step(within)['action'].shape == (2,)
    past = make_request(np.arange(2), np.ones(2, np.int64), obs, np.array([0.0, 50.0]),
                        np.ones(2), np.ones(2))
    with pytest.raises(InvalidRequestError, match=r'reward .* exceeds .*\|reward\| <= 5'):
      node.step(past)
  finally:
    node.shutdown()
    replay.stop()


def test_the_flags_reach_the_config(tmp_path):
  def config(*flags):
    parser = argparse.ArgumentParser()
    program_flags.add_program_args(parser)
    parsed = parser.parse_args(['catch', 'vtrace', '1', *flags])
    return program_flags.make_program_inputs(parsed, str(tmp_path))[3]
  assert config().max_abs_reward is None and config().env_step_timeout_s == 60.0
  tuned = config('--max_abs_reward', '100', '--env_step_timeout_s', '0')
  assert tuned.max_abs_reward == 100.0 and tuned.env_step_timeout_s is None
