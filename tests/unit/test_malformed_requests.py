"""Malformed requests over real Courier: each caller gets its own clear error, the server
keeps serving everyone else (SEED's inference server is shared by every actor)."""

import threading

import courier
import numpy as np
import portpicker
import pytest
from launchpad.nodes.courier import courier_utils

from seedacme import envs
from seedacme.wire.protocol import SERVER_ERROR_MARKER, InvalidRequestError, as_refusal
from seedacme.serving.server import InferenceServer
from seedacme.serving.policy import PolicyStep, StatelessPolicy
from seedacme.wire import courier_guard
from seedacme.wire.protocol import make_request

SPEC = envs.EnvSpec((3, 2), 'float32', 4)
NUM_ENVS = 16


class _ArgmaxObsPolicy(StatelessPolicy):
  def act(self, observation, eval_mask, env_ids):
    return PolicyStep(observation.reshape(len(observation), -1)[:, :4].argmax(-1)
                      .astype(np.int32), {}, ())


class _Service:
  def __init__(self):
    self.server = InferenceServer(_ArgmaxObsPolicy(NUM_ENVS), SPEC, NUM_ENVS, None,
                                  max_batch_envs=8, batch_timeout_s=0.002,
                                  max_request_envs=8)

  def step(self, request):  # seedacme's Courier wire, as the central node serves it
    return courier_guard.plain(self.server.step(courier_guard.accept(request, 'step')))


class _Client:
  """A Courier client on seedacme's wire (`plain` out, `accept` back), as actors are."""

  def __init__(self, address):
    self._client = courier.Client(address)

  def step(self, request):
    return courier_guard.accept(self._client.step(courier_guard.plain(request)), 'reply')


@pytest.fixture(scope='module')
def service():
  svc = _Service()
  port = portpicker.pick_unused_port()
  srv = courier_utils.make_courier_server(svc, port=port, thread_pool_size=16)
  srv.Start()
  yield svc, f'localhost:{port}'
  srv.Stop()
  srv.Join()
  svc.server.close()


def _good(env_ids, hot=1):
  k = len(env_ids)
  obs = np.zeros((k, 3, 2), np.float32)
  obs.reshape(k, -1)[:, hot] = 1.0
  return make_request(env_ids, np.full(k, 1), obs, np.zeros(k), np.ones(k), np.ones(k, np.int8))


def _with(request, row, values):
  """`request` with one row of its transition array (0 reward, 1 discount) replaced."""
  transition = request['transition'].copy()
  transition[row] = values
  return {**request, 'transition': transition}


BAD_REQUESTS = {
    'wrong shape': lambda: {**_good([8, 9]), 'observation': np.zeros((2, 2, 3), np.float32)},
    'wrong dtype': lambda: {**_good([8, 9]), 'observation': np.zeros((2, 3, 2), np.uint8)},
    'NaN': lambda: {**_good([8, 9]), 'observation': np.full((2, 3, 2), np.nan, np.float32)},
    'inf reward': lambda: _with(_good([8, 9]), 0, [0.0, np.inf]),
    'huge reward': lambda: _with(_good([8, 9]), 0, [0.0, 3e38]),
    'NaN reward': lambda: _with(_good([8, 9]), 0, [np.nan, 0.0]),
    'NaN discount': lambda: _with(_good([8, 9]), 1, [1.0, np.nan]),
    'NaN step type': lambda: _with(_good([8, 9]), 2, [np.nan, 1.0]),
    'inf observation': lambda: {**_good([8, 9]),
                                'observation': np.full((2, 3, 2), -np.inf, np.float32)},
    'int observation': lambda: {**_good([8, 9]), 'observation': np.zeros((2, 3, 2), np.int64)},
    'bool transition': lambda: {**_good([8, 9]), 'transition': np.ones((3, 2), bool)},
    'unknown env id': lambda: _good([8, 99]),
    'duplicated env ids': lambda: _good([8, 8]),
    'wrong batch length': lambda: {**_good([8, 9]), 'transition': np.zeros((3, 3), np.float32)},
    'huge payload': lambda: {**_good(list(range(8, 16))),
                             'ids': np.zeros((2, 2000), np.int64),
                             'observation': np.zeros((2000, 3, 2), np.float32)},
    'not a dict': lambda: [1, 2, 3],
}
EXPECTED = {
    'wrong shape': 'observation has shape (2, 2, 3)', 'wrong dtype': 'dtype uint8',
    'NaN': 'NaN or inf', 'inf reward': 'reward contains NaN or inf',
    'huge reward': "exceeds the env's bound |reward| <= 1e+06",
    'NaN reward': 'reward contains NaN or inf', 'NaN discount': 'discount contains NaN',
    'NaN step type': 'step_type contains NaN', 'inf observation': 'observation contains NaN',
    'int observation': 'observation has dtype int64', 'bool transition': 'transition must be',
    'unknown env id': 'env_ids [99] are unknown', 'duplicated env ids': 'duplicated',
    'wrong batch length': 'transition must have shape (3, 2)', 'huge payload': 'at most 8',
    'not a dict': 'request must be a dict',
}


@pytest.mark.parametrize('name', sorted(BAD_REQUESTS))
def test_each_malformed_request_gets_a_named_error(service, name):
  _, address = service
  client = _Client(address)
  with pytest.raises(Exception) as error:
    client.step(BAD_REQUESTS[name]())
  message = str(error.value)
  assert SERVER_ERROR_MARKER in message and 'InvalidRequestError' in message
  assert EXPECTED[name] in message
  refusal = as_refusal(error.value)  # the actor's view: a typed refusal, not retried
  assert isinstance(refusal, InvalidRequestError) and EXPECTED[name] in str(refusal)
  # The same server still answers a good request right away.
  assert client.step(_good([0, 1], hot=2))['action'].tolist() == [2, 2]


@pytest.mark.timeout(120)
def test_fuzz_bad_requests_while_good_actors_are_served(service):
  svc, address = service
  rng = np.random.default_rng(0)
  stop = threading.Event()
  served = {0: 0, 1: 0}
  wrong = []

  def good_actor(i):
    client = _Client(address)
    ids = [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3]
    while not stop.is_set():
      hot = served[i] % 4
      reply = client.step(_good(ids, hot=hot))
      if reply['action'].tolist() != [hot] * 4:
        wrong.append(reply)
      served[i] += 1

  actors = [threading.Thread(target=good_actor, args=(i,)) for i in (0, 1)]
  for t in actors:
    t.start()
  bad_client = _Client(address)
  refused_before = svc.server.requests_refused
  errors = 0
  names = sorted(BAD_REQUESTS)
  for _ in range(300):
    request = BAD_REQUESTS[names[rng.integers(len(names))]]()
    if isinstance(request, dict) and rng.random() < 0.3:  # corrupt one more field
      junk = [None, 'x', np.zeros((0,)), np.ones((5, 5)), 3.5]
      request[list(request)[rng.integers(len(request))]] = junk[rng.integers(len(junk))]
    try:
      bad_client.step(request)
    except Exception as e:  # noqa: BLE001
      assert SERVER_ERROR_MARKER in str(e)
      errors += 1
  stop.set()
  for t in actors:
    t.join(10)
  assert errors == 300  # every bad request was refused ...
  assert svc.server.requests_refused - refused_before == 300
  assert min(served.values()) > 20 and not wrong  # ... and good actors were served right


def test_an_unreachable_server_is_not_a_refusal():
  assert as_refusal(RuntimeError('failed to connect to all addresses')) is None
  assert as_refusal(InvalidRequestError('x')) is not None
