"""A seed names a run's randomness whatever the split (issue 63, Deliver 1).

- Env e's seed, and so its first observation, is the same whether e is slot 0 of actor
  1 in 2 x 8 or slot 0 of actor 2 in 4 x 4 (on c8a4f53 actor i had seed + 1000 i, so
  env 8 had seed 1000 in one and 2000 in the other).
- Two central nodes built with one run seed start from the same weights (on c8a4f53
  TensorFlow was never seeded: every start drew new ones).
- PPO's minibatch plan of learner step k is a function of (seed, k): a resumed learner
  draws the plan the uninterrupted one drew (on c8a4f53 it restarted the generator).
"""

import hashlib
import os
from unittest import mock

import numpy as np
import pytest
import reverb
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from seedacme import envs
from seedacme.actor.engines import half_batch_driver, make_engine
from seedacme.actor.env_actor import env_seed
from seedacme.agents import ppo, vtrace
from seedacme.agents.ppo import learning as ppo_learning
from seedacme.config import ProgramConfig
from seedacme.launchers import local, program_flags
from seedacme.nodes import program as program_lib
from seedacme.nodes.central import CentralNode
from seedacme.trajectories.datasets import RoundBatches
from seedacme.types import FIRST, MID, EnvSpec


def _nodes(argv, tmp_path):
  """[(node kwargs)] of the actors and evaluator of the program `run_local argv` builds."""
  args = local.parse_args([*argv, '--checkpoint_interval_s', '0'])
  factory, spec, builder, config = program_flags.make_program_inputs(args, str(tmp_path))
  with mock.patch.dict(os.environ):  # make_program pins the launcher's (machine_pins)
    program = program_lib.make_program(builder, factory, spec, config, name='t')
  return {group: [getattr(n, '_func_kwargs', None) or n._kwargs for n in nodes]  # pylint: disable=protected-access
          for group, nodes in program.groups.items() if group in ('actor', 'evaluator')}


def _first_steps(kwargs):
  """{global env id: (seed, first observation)} of one actor node's envs, built as
  `EnvActor` builds them (`make_engine(factory, K, seed)`, engines add the slot)."""
  engine = make_engine(kwargs['env_factory'], kwargs['num_envs'], seed=kwargs['seed'])
  try:
    step = half_batch_driver(engine).recv()
    return {kwargs['first_env_id'] + int(slot): (kwargs['seed'] + int(slot),
                                                 step.step.observation[i].copy())
            for i, slot in enumerate(step.slots)}
  finally:
    engine.close()


@pytest.mark.timeout(300)
def test_an_envs_seed_and_first_observation_do_not_depend_on_the_split(tmp_path):
  splits = {}
  for actors, per_actor in (('2', '8'), ('4', '4'), ('1', '16')):
    nodes = _nodes(['cartpole', 'ppo', actors, per_actor, '--seed', '3',
                    '--num_eval_envs', '2'], tmp_path)
    steps = {}
    for kwargs in nodes['actor']:
      steps.update(_first_steps(kwargs))
    assert sorted(steps) == list(range(16))
    splits[(actors, per_actor)] = steps
    evaluator = _first_steps(nodes['evaluator'][0])
    # The evaluator's envs: seeds of their own, apart from every training env's.
    assert not {s for s, _ in evaluator.values()} & {s for s, _ in steps.values()}
  reference = splits[('2', '8')]
  assert len({s for s, _ in reference.values()}) == 16
  for split, steps in splits.items():
    for e in range(16):
      assert steps[e][0] == reference[e][0], (split, e)
      np.testing.assert_array_equal(steps[e][1], reference[e][1], err_msg=f'{split} env {e}')
  # A real env: its first observation follows its seed (env 8 is not env 9).
  assert not np.array_equal(reference[8][1], reference[9][1])
  # Another run seed, other envs.
  other = _first_steps(_nodes(['cartpole', 'ppo', '1', '16', '--seed', '4'],
                              tmp_path)['actor'][0])
  assert not np.array_equal(other[8][1], reference[8][1])


def test_a_restarted_actors_envs_get_seeds_no_other_env_has(tmp_path):
  nodes = _nodes(['catch', 'vtrace', '4', '4', '--num_eval_envs', '4'], tmp_path)
  seen = set()
  for kwargs in nodes['actor'] + nodes['evaluator']:
    for restarts in range(4):
      first = env_seed(kwargs['seed'], restarts)
      seeds = set(range(first, first + kwargs['num_envs']))
      assert not seeds & seen and max(seeds) < 2**31
      seen |= seeds


def _central(tmp_path, **config):
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(hidden_sizes=(32,), batch_size=8,
                                                     unroll_length=5))
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  server = reverb.Server(builder.make_replay_tables(spec), port=None)
  config = ProgramConfig(**{'num_actors': 2, 'envs_per_actor': 4, 'num_eval_envs': 0,
                            'logdir': str(tmp_path), 'checkpoint_interval_s': None,
                            **config})
  central = CentralNode(builder, spec, config, reverb.Client(f'localhost:{server.port}'))
  digest = hashlib.sha256()
  for v in central._policy_variables:  # pylint: disable=protected-access
    digest.update(v.numpy().tobytes())
  return central, server, digest.hexdigest()


@pytest.mark.timeout(300)
def test_one_run_seed_gives_the_same_initial_weights(tmp_path):
  made = []
  try:
    made.append(_central(tmp_path / 'a', seed=0))
    tf.random.uniform([3])  # TF's own draws between the two starts change nothing
    made.append(_central(tmp_path / 'b', seed=0, reproducible=True))
    made.append(_central(tmp_path / 'c', seed=1))
    (plain, _, a), (exact, _, b), (_, _, c) = made
    assert a == b and a != c
    # The reproducible one: op determinism on, the learner on whole rounds in order.
    assert tf_config.is_op_determinism_enabled()
    assert isinstance(exact.learner._batches, RoundBatches)  # pylint: disable=protected-access
    assert not isinstance(plain.learner._batches, RoundBatches)  # pylint: disable=protected-access
  finally:
    tf_config.disable_op_determinism()  # process-wide: not for the tests after this one
    for central, server, _ in made:
      central.shutdown()
      server.stop()


CARTPOLE = EnvSpec((4,), 'float32', 2)


def _ppo_batch(builder, seed):
  rng = np.random.default_rng(seed)
  b = builder.config.batch_size
  batch = {}
  for name, s in builder.item_signature(CARTPOLE).items():
    shape = (b,) + tuple(s.shape)
    if name == 'step_type':
      x = np.full(shape, MID, np.int8)
      x[:, 0] = FIRST
    elif name == 'discount':
      x = np.ones(shape, np.float32)
    elif s.dtype.is_integer:
      x = np.zeros(shape, s.dtype.as_numpy_dtype)
    else:
      x = rng.normal(size=shape).astype(s.dtype.as_numpy_dtype)
    batch[name] = tf.constant(x)
  return batch


@pytest.mark.timeout(300)
def test_ppos_minibatch_plan_is_a_function_of_seed_and_learner_step(monkeypatch):
  plans = []

  def recorded(*args, **kwargs):
    plans.append(np.stack(minibatch_plan(*args, **kwargs)))
    return plans[-1]
  minibatch_plan = ppo_learning.minibatch_plan
  monkeypatch.setattr(ppo_learning, 'minibatch_plan', recorded)
  config = ppo.PPOConfig(unroll_length=4, batch_size=4, epochs=2, num_minibatches=2,
                         hidden_sizes=(8,), seed=5)

  builder = ppo.PPOBuilder(config)
  learner = ppo_learning.PPOLearner(builder.make_networks(CARTPOLE), config, None,
                                    builder.item_signature(CARTPOLE))
  learner.train_on(_ppo_batch(builder, 0))
  learner.train_on(_ppo_batch(builder, 1))
  learner.num_steps.assign(1)  # as a resume from a checkpoint saved after step 1
  learner.train_on(_ppo_batch(builder, 1))
  assert len(plans) == 3
  assert not np.array_equal(plans[0], plans[1])  # each step its own shuffles ...
  np.testing.assert_array_equal(plans[2], plans[1])  # ... and step 1's are step 1's
  np.testing.assert_array_equal(
      plans[1], np.stack(minibatch_plan(16, 2, 2, ppo_learning.step_plan_rng(5, 1))))
