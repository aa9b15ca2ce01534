"""Request validation: every malformed request gets an error that names the problem."""

import math

import numpy as np
import pytest

from seedacme.types import Mode, EnvSpec
from seedacme.wire.protocol import (InvalidRequestError, make_request, merge_requests,
                                    validate_request)

SPEC = EnvSpec(observation_shape=(3, 2), observation_dtype='float32', num_actions=3)


def _good(k=4, first=0, **fields):
  """A good request, with any logical field replaced (env_ids, reward, ...)."""
  parts = dict(env_ids=np.arange(first, first + k), run_ids=np.full(k, 7),
               observation=np.zeros((k, 3, 2), np.float32), reward=np.zeros(k),
               discount=np.ones(k), step_type=np.ones(k, np.int8))
  parts.update(fields)
  return make_request(**parts)


def _check(request, pattern):
  with pytest.raises(InvalidRequestError, match=pattern):
    validate_request(request, SPEC, num_envs=8, max_request_envs=6)


def test_good_request_is_canonicalised():
  r = validate_request(_good(), SPEC, num_envs=8, max_request_envs=6)
  assert r.size == 4 and r.env_ids.dtype == np.int64 and r.step_type.dtype == np.int8
  np.testing.assert_array_equal(r.env_ids, np.arange(4))
  np.testing.assert_array_equal(r.run_ids, np.full(4, 7))
  np.testing.assert_array_equal(r.step_type, np.ones(4))
  assert r.mode is Mode.TRAIN  # the default
  assert validate_request({**_good(), 'mode': 'eval'}, SPEC, num_envs=8,
                          max_request_envs=6).mode is Mode.EVAL


def test_run_ids_keep_all_63_bits():
  big = (1 << 62) + 12345
  r = validate_request(_good(run_ids=np.full(4, big)), SPEC, num_envs=8, max_request_envs=6)
  assert r.run_ids.tolist() == [big] * 4


def _nan_obs():
  obs = np.zeros((4, 3, 2), np.float32)
  obs[2, 0, 0] = np.nan
  return obs


@pytest.mark.parametrize('request_fn,pattern', [
    (lambda: _good(observation=np.zeros((4, 2, 3), np.float32)), r'observation has shape \(4, 2, 3\)'),
    (lambda: _good(observation=np.zeros((4, 3, 2), np.float64)), 'observation has dtype float64'),
    (lambda: _good(observation=np.zeros((3, 3, 2), np.float32)), r'expected \(4, 3, 2\)'),
    (lambda: _good(observation=_nan_obs()), r'NaN or inf for envs \[2\]'),
    (lambda: {**_good(), 'observation': [[0.0]]}, 'observation must be a numpy array'),
    (lambda: _good(env_ids=np.array([0, 1, 1, 2])), r'duplicated within the request: \[1\]'),
    (lambda: _good(env_ids=np.array([0, 1, 2, 9])), r'env_ids \[9\] are unknown'),
    (lambda: _good(env_ids=np.array([0, 1, 2, -1])), r'env_ids \[-1\] are unknown'),
    (lambda: {**_good(), 'ids': np.zeros((2, 4))}, 'ids must be integers'),
    (lambda: {**_good(), 'ids': np.zeros((3, 4), np.int64)}, r'ids must have shape \(2, K\)'),
    (lambda: {**_good(), 'ids': [[0, 1], [2, 3]]}, 'ids must be a numpy array'),
    (lambda: _good(reward=np.array([0, np.inf, 0, 0])), r'reward contains NaN or inf at positions \[1\]'),
    (lambda: _good(discount=np.array([1, np.nan, 1, 1])), 'discount contains NaN or inf'),
    (lambda: {**_good(), 'transition': np.zeros((3, 5), np.float32)}, r'transition must have shape \(3, 4\)'),
    (lambda: {**_good(), 'transition': np.zeros((3, 4), bool)}, 'transition must be numeric'),
    (lambda: _good(discount=np.array([1, 2, 1, 1.0])), r'discount must lie in \[0, 1\]'),
    (lambda: _good(step_type=np.array([0, 1, 5, 2])), 'step_type values must be 0'),
    (lambda: _good(step_type=np.array([0, 1, 0.5, 2])), 'step_type values must be 0'),
    (lambda: {k: v for k, v in _good().items() if k != 'transition'}, r"missing fields \['transition'\]"),
    (lambda: {**_good(), 'extra': 1}, r"unknown fields \['extra'\]"),
    (lambda: {**_good(), 'mode': 'greedy'}, r"mode must be one of \['eval', 'train'\], got 'greedy'"),
    (lambda: {**_good(), 'mode': True}, 'mode must be one of'),
])
def test_malformed_requests_are_named(request_fn, pattern):
  _check(request_fn(), pattern)


def test_oversized_and_empty_requests():
  _check(_good(k=7), 'at most 6 are allowed')
  _check(_good(k=0), 'no envs')


def test_not_a_dict():
  _check([1, 2, 3], 'request must be a dict')


def _actor_request(env_ids, mode='train', value=0.0, **overrides):
  k = len(env_ids)
  request = make_request(np.asarray(env_ids), np.full(k, 3), np.full((k, 3, 2), value, np.float32),
                         np.zeros(k), np.ones(k), np.ones(k), Mode(mode))
  request.update(overrides)
  return request


def test_merged_requests_validate_as_one_with_each_envs_mode():
  requests = [_actor_request([0, 1]), _actor_request([5], 'eval'), _actor_request([2, 3])]
  owned = [range(0, 2), range(4, 6), range(2, 4)]
  merged = merge_requests(requests, SPEC, num_envs=8, max_request_envs=6, owned=owned)
  assert merged.env_ids.tolist() == [0, 1, 5, 2, 3]
  assert merged.evaluating().tolist() == [False, False, True, False, False]
  one_by_one = [validate_request(r, SPEC, num_envs=8, max_request_envs=6) for r in requests]
  np.testing.assert_array_equal(merged.observation,
                                np.concatenate([r.observation for r in one_by_one]))


@pytest.mark.parametrize('bad', [
    lambda: _actor_request([2], value=np.nan),  # NaN observation
    lambda: _actor_request([0]),  # env 0 is another actor's (and in flight twice)
    lambda: _actor_request([2], mode='eval', transition=np.zeros((3, 2), np.float32)),
    lambda: {**_actor_request([2]), 'mode': 'greedy'},
    lambda: _actor_request([7]),  # outside the envs it attached with
])
def test_any_bad_request_unmerges_the_group(bad):
  requests = [_actor_request([0, 1]), bad()]
  assert merge_requests(requests, SPEC, num_envs=8, max_request_envs=6,
                        owned=[range(0, 2), range(2, 4)]) is None


def test_rewards_past_the_env_specs_bound_are_refused_by_name():
  _check(_good(reward=np.array([0, 2e6, 0, -4e6])),
         r"reward \[2000000.0, -4000000.0\] at positions \[1, 3\] exceeds the env's bound "
         r"\|reward\| <= 1e\+06 \(EnvSpec.max_abs_reward\)")
  _check(_good(reward=np.array([0, 0, 3e38, 0])), r'positions \[2\] exceeds')  # finite, huge
  validate_request(_good(reward=np.array([1e6, -1e6, 0, 0])), SPEC, 8, 6)  # the bound passes
  ten = EnvSpec((3, 2), 'float32', 3, max_abs_reward=10.0)
  with pytest.raises(InvalidRequestError, match=r'\[11.0\] at positions \[2\] .* <= 10 '):
    validate_request(_good(reward=np.array([0, 0, 11, -10])), ten, 8, 6)
  unbounded = EnvSpec((3, 2), 'float32', 3, max_abs_reward=math.inf)  # finite is enough
  validate_request(_good(reward=np.array([0, 0, 3e38, 0])), unbounded, 8, 6)
  for bad in (0.0, -1.0, math.nan):
    with pytest.raises(ValueError, match='max_abs_reward must be > 0'):
      EnvSpec((3, 2), 'float32', 3, max_abs_reward=bad)
