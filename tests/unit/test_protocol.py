"""Request validation: every malformed request gets an error that names the problem."""

import numpy as np
import pytest

from seedacme.envs.registry import EnvSpec
from seedacme.protocol import InvalidRequestError, make_request, validate_request

SPEC = EnvSpec(observation_shape=(3, 2), observation_dtype='float32', num_actions=3)


def _good(k=4, first=0):
  return make_request(np.arange(first, first + k), np.full(k, 7),
                      np.zeros((k, 3, 2), np.float32), np.zeros(k), np.ones(k),
                      np.ones(k, np.int8))


def _check(request, pattern):
  with pytest.raises(InvalidRequestError, match=pattern):
    validate_request(request, SPEC, num_envs=8, max_request_envs=6)


def test_good_request_is_canonicalised():
  r = validate_request(_good(), SPEC, num_envs=8, max_request_envs=6)
  assert r.size == 4 and r.env_ids.dtype == np.int64 and r.step_type.dtype == np.int8
  assert not r.greedy


@pytest.mark.parametrize('mutate,pattern', [
    (lambda r: r.update(observation=np.zeros((4, 2, 3), np.float32)), r'observation has shape \(4, 2, 3\)'),
    (lambda r: r.update(observation=np.zeros((4, 3, 2), np.float64)), 'observation has dtype float64'),
    (lambda r: r.update(observation=np.zeros((3, 3, 2), np.float32)), r'expected \(4, 3, 2\)'),
    (lambda r: r['observation'].__setitem__((2, 0, 0), np.nan), r'NaN or inf for envs \[2\]'),
    (lambda r: r.update(observation=[[0.0]]), 'observation must be a numpy array'),
    (lambda r: r.update(env_ids=np.array([0, 1, 1, 2])), r'duplicated within the request: \[1\]'),
    (lambda r: r.update(env_ids=np.array([0, 1, 2, 9])), r'env_ids \[9\] are unknown'),
    (lambda r: r.update(env_ids=np.array([0, 1, 2, -1])), r'env_ids \[-1\] are unknown'),
    (lambda r: r.update(env_ids=np.array([0.0, 1, 2, 3])), 'env_ids must be integers'),
    (lambda r: r.update(run_ids=np.array([1, 2])), r'run_ids must have shape \(4,\)'),
    (lambda r: r.update(reward=np.array([0, np.inf, 0, 0])), 'reward contains NaN or inf'),
    (lambda r: r.update(reward=np.zeros(5)), r'reward must have shape \(4,\)'),
    (lambda r: r.update(discount=np.array([1, 2, 1, 1.0])), r'discount must lie in \[0, 1\]'),
    (lambda r: r.update(step_type=np.array([0, 1, 5, 2])), 'step_type values must be 0'),
    (lambda r: r.pop('reward'), r"missing fields \['reward'\]"),
    (lambda r: r.update(extra=1), r"unknown fields \['extra'\]"),
    (lambda r: r.update(greedy='yes'), 'greedy must be a bool'),
])
def test_malformed_requests_are_named(mutate, pattern):
  request = _good()
  mutate(request)
  _check(request, pattern)


def test_oversized_and_empty_requests():
  _check(_good(k=7), 'at most 6 are allowed')
  empty = _good()
  for key in ('env_ids', 'run_ids', 'reward', 'discount', 'step_type'):
    empty[key] = empty[key][:0]
  empty['observation'] = empty['observation'][:0]
  _check(empty, 'no envs')


def test_not_a_dict():
  _check([1, 2, 3], 'request must be a dict')
