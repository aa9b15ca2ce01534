"""The wire format between env-only actors and the inference server.

One Courier call `step(request)` carries a whole batch of K environments of one actor,
as three arrays (and a flag):

    ids          int64 [2, K]    row 0: global env ids, unique, in [0, num_envs)
                                 row 1: run ids, chosen when the actor (re)started; a
                                        change resets that env's state on the server
    transition   float32 [3, K]  row 0: reward that arrived with this observation (0 on
                                        FIRST), |reward| <= the env spec's
                                        `max_abs_reward` (1e6 unless it says otherwise);
                                        row 1: discount in [0, 1]; row 2: step
                                        type, dm_env.StepType 0 FIRST, 1 MID, 2 LAST
    observation  [K, *obs_shape] exactly the env's observation dtype (uint8 stays uint8)
    mode         str             optional, a `Mode` value: 'train' (default) or 'eval'
                                 (evaluation envs act greedily, are not trained on)

Why three arrays, not one per field: Courier serializes every array of a request on its
own, and on this machine each costs tens of microseconds on both sides. Measured with a
Courier echo of a K=16 Catch request, one client, same process (tmp microbenchmark):
seven fields 612-626 us per round trip, these three arrays and the mode 461 us.

The reply is `{'action': [K, *action_shape]}` (int32 indices, or float32 continuous
actions), or `{'shutting_down': reason}` while the server
stops (the actor waits and sends the same request again). `validate_request` turns
anything else into an `InvalidRequestError` whose message names the field (the logical
one: `env_ids`, `reward`, ...) and what was wrong; the server sends it back to that
caller only.

What is validated must be what is served: `validate_request` returns views of the
arrays it was given, so a caller passes arrays nobody else can write while the request
is served. Courier's are (deserialized for this call); the shared-memory server copies
each request out of its actor's segment first (`seedacme.wire.shm.Segment.request`).
"""

import math
from typing import Any, Dict, Mapping, NamedTuple, Sequence

import numpy as np

from seedacme.types import EnvSpec, Mode

REQUIRED_FIELDS = ('ids', 'transition', 'observation')
OPTIONAL_FIELDS = ('mode',)
_MODES = {m.value: m for m in Mode}


class InvalidRequestError(ValueError):
  """A request the inference server refuses; the message says why."""


# Courier hands a client the server's exception as a RuntimeError whose text starts
# with this, then names the exception's type: the only form a refusal can take on the
# wire, read in one place (`as_refusal`).
SERVER_ERROR_MARKER = 'Python exception was raised on the server'


class RemoteRefusalError(InvalidRequestError, RuntimeError):
  """A refusal the server sent back through Courier (which raises it as RuntimeError)."""


def as_refusal(error: BaseException) -> InvalidRequestError | None:
  """`error` of an inference call as an `InvalidRequestError` when the server refused
  the request (raised in-process, or sent back by Courier); None for other failures
  (server unreachable, restarting), which a caller may retry."""
  if isinstance(error, InvalidRequestError):
    return error
  message = str(error)
  if SERVER_ERROR_MARKER in message and InvalidRequestError.__name__ in message:
    return RemoteRefusalError(message.strip().splitlines()[-1])
  return None


class Request(NamedTuple):
  """A validated request (arrays converted to their canonical dtypes)."""
  env_ids: np.ndarray  # int64 [K]
  run_ids: np.ndarray  # int64 [K]
  observation: np.ndarray  # [K, *obs_shape]
  reward: np.ndarray  # float32 [K]
  discount: np.ndarray  # float32 [K]
  step_type: np.ndarray  # int8 [K]
  mode: Mode
  # Per env, whether it is `Mode.EVAL`: set on a request merged from several actors'
  # (`merge_requests`), whose modes may differ; None: every env is in `mode`.
  eval_mask: np.ndarray | None = None

  @property
  def size(self) -> int:
    return int(self.env_ids.shape[0])

  def evaluating(self) -> np.ndarray:
    """bool [K]: the envs of `Mode.EVAL`."""
    if self.eval_mask is not None:
      return self.eval_mask
    return np.full(self.size, self.mode is Mode.EVAL)


def make_request(env_ids, run_ids, observation, reward, discount, step_type,
                 mode: Mode = Mode.TRAIN) -> dict:
  """Builds the request an actor sends (the inverse of `validate_request`)."""
  return {
      'ids': np.stack([np.asarray(env_ids, np.int64), np.asarray(run_ids, np.int64)]),
      'transition': np.stack([np.asarray(reward, np.float32),
                              np.asarray(discount, np.float32),
                              np.asarray(step_type, np.float32)]),
      'observation': observation,
      'mode': mode.value,
  }


def fields(request: Mapping[str, Any]) -> Dict[str, Any]:
  """The logical fields of a well-formed request, unvalidated (tests, fake servers)."""
  ids, transition = request['ids'], request['transition']
  return {'env_ids': ids[0], 'run_ids': ids[1], 'observation': request['observation'],
          'reward': transition[0], 'discount': transition[1],
          'step_type': transition[2].astype(np.int8),
          'mode': _MODES[request.get('mode', Mode.TRAIN.value)]}


# Validation runs once per request on the server's hot path. numpy calls on small
# arrays cost 5-15 us each here, so every check is one reduction or an attribute test,
# and the detailed message is worked out only once a check fails. Measured
# (K=16 Catch request, in process): 77 us per request with seven fields and a numpy
# call per check, 44 us with one reduction per check, 29 us with the three-array layout.


def _all_finite(value: np.ndarray) -> bool:
  """One reduction: a float64 sum is finite iff no element is NaN or inf."""
  return math.isfinite(value.sum(dtype=np.float64)) if value.size else True


def _few(values: np.ndarray, n: int = 16) -> str:
  """At most `n` of `values` for a message (a refusal stays short however big the
  request)."""
  if len(values) <= n:
    return str(values.tolist())
  return f'[{", ".join(map(str, values[:n].tolist()))}, ...] ({len(values)} in all)'


def _array(request: Mapping[str, Any], name: str, kinds: str, what: str) -> np.ndarray:
  value = request[name]
  if not isinstance(value, np.ndarray):
    raise InvalidRequestError(f'{name} must be a numpy array, got {type(value).__name__}')
  if value.dtype.kind not in kinds:
    raise InvalidRequestError(f'{name} must be {what}, got dtype {value.dtype}')
  return value


def validate_request(request: Any, spec: EnvSpec, num_envs: int,
                     max_request_envs: int) -> Request:
  """Checks a raw request against the env spec; returns it in canonical form (views
  of the request's arrays where no conversion was needed: pass private arrays).

  Raises:
    InvalidRequestError: naming the first field that is wrong.
  """
  if not isinstance(request, Mapping):
    raise InvalidRequestError(f'request must be a dict, got {type(request).__name__}')
  if len(request) != len(REQUIRED_FIELDS) + ('mode' in request) or \
      not all(f in request for f in REQUIRED_FIELDS):
    missing = [f for f in REQUIRED_FIELDS if f not in request]
    if missing:
      raise InvalidRequestError(f'request is missing fields {missing}')
    unknown = sorted(set(request) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    raise InvalidRequestError(f'request has unknown fields {unknown}')

  ids = _array(request, 'ids', 'iu', 'integers (env ids; run ids)')
  if ids.ndim != 2 or ids.shape[0] != 2:
    raise InvalidRequestError(f'ids must have shape (2, K) (env ids; run ids), got '
                              f'{ids.shape}')
  env_ids = ids[0].astype(np.int64, copy=False)
  k = env_ids.shape[0]
  if k == 0:
    raise InvalidRequestError('request has no envs (env_ids is empty)')
  if k > max_request_envs:
    raise InvalidRequestError(
        f'request has {k} envs (env_ids); at most {max_request_envs} are allowed per call')
  if k > num_envs:  # env ids are distinct and known: no request holds more
    raise InvalidRequestError(f'request has {k} envs (env_ids); this server has {num_envs}')
  if env_ids.min() < 0 or env_ids.max() >= num_envs:
    bad = env_ids[(env_ids < 0) | (env_ids >= num_envs)]
    raise InvalidRequestError(
        f'env_ids {_few(bad)} are unknown; this server has env ids 0..{num_envs - 1}')
  if len(set(env_ids.tolist())) != k:
    values, counts = np.unique(env_ids, return_counts=True)
    raise InvalidRequestError(
        f'env_ids are duplicated within the request: {_few(values[counts > 1])}')
  run_ids = ids[1].astype(np.int64, copy=False)

  observation = request['observation']
  if not isinstance(observation, np.ndarray):
    raise InvalidRequestError(
        f'observation must be a numpy array, got {type(observation).__name__}')
  expected_shape = (k,) + tuple(spec.observation_shape)
  if observation.shape != expected_shape:
    raise InvalidRequestError(
        f'observation has shape {observation.shape}; expected {expected_shape} '
        f'({k} envs x observation shape {tuple(spec.observation_shape)})')
  if observation.dtype != spec.dtype:
    raise InvalidRequestError(
        f'observation has dtype {observation.dtype}; expected {spec.dtype}')
  if observation.dtype.kind == 'f' and not _all_finite(observation):
    rows = np.flatnonzero(~np.isfinite(observation.reshape(k, -1)).all(axis=1))
    raise InvalidRequestError(
        f'observation contains NaN or inf for envs {_few(env_ids[rows])}')

  transition = _array(request, 'transition', 'fiu', 'numeric (reward; discount; step type)')
  if transition.shape != (3, k):
    raise InvalidRequestError(
        f'transition must have shape (3, {k}) (reward; discount; step type for {k} envs), '
        f'got {transition.shape}')
  transition = transition.astype(np.float32, copy=False)
  if not _all_finite(transition):
    for row, name in enumerate(('reward', 'discount', 'step_type')):
      bad = np.flatnonzero(~np.isfinite(transition[row]))
      if bad.size:
        raise InvalidRequestError(f'{name} contains NaN or inf at positions {_few(bad)}')
  reward, discount = transition[0], transition[1]
  # One dot product (~3.5 us with its float64 cast, which cannot overflow; a max and a
  # min cost ~9): no |r| passes the bound while the sum of squares stays within its
  # square; only past it is each reward looked at.
  bound = spec.max_abs_reward
  r64 = reward.astype(np.float64)
  if not float(r64 @ r64) <= bound * bound and \
      not (reward.max() <= bound and reward.min() >= -bound):
    bad = np.flatnonzero(np.abs(reward) > bound)
    raise InvalidRequestError(
        f'reward {_few(reward[bad])} at positions {_few(bad)} exceeds the env\'s '
        f'bound |reward| <= {bound:g} (EnvSpec.max_abs_reward)')
  if not (discount.min() >= 0 and discount.max() <= 1):
    raise InvalidRequestError(f'discount must lie in [0, 1], got {_few(discount)}')
  step_type = transition[2].astype(np.int8)
  if step_type.min() < 0 or step_type.max() > 2 or not (step_type == transition[2]).all():
    raise InvalidRequestError(
        f'step_type values must be 0 (FIRST), 1 (MID) or 2 (LAST), got '
        f'{_few(transition[2])}')

  mode = _MODES.get(request.get('mode', Mode.TRAIN.value)) \
      if isinstance(request.get('mode', ''), str) else None
  if mode is None:
    raise InvalidRequestError(f"mode must be one of {sorted(_MODES)}, got "
                              f"{request['mode']!r}")

  return Request(env_ids, run_ids, observation, reward, discount, step_type, mode)


def merge_requests(requests: Sequence[Mapping[str, Any]], spec: EnvSpec, num_envs: int,
                   max_request_envs: int,
                   owned: Sequence[range]) -> Request | None:
  """Several actors' requests (each keeping to its `owned` env ids), validated as one.

  The shared-memory server serves all actors that are ready together; validating their
  requests one by one cost ~17 us each at K=1 here (`bench/inference_service.py`), one
  pass over the merged arrays about as much as one. Returns None when any request is
  wrong in any way: the caller then validates them one by one, so each refusal still
  names its own request's fault and reaches its own actor.
  """
  try:
    sizes = []
    for r in requests:
      k = r['ids'].shape[1]
      if not (0 < k <= max_request_envs and r['transition'].shape[1] == k
              and len(r['observation']) == k and r.get('mode', 'train') in _MODES):
        return None
      sizes.append(k)
    merged = {'ids': np.concatenate([r['ids'] for r in requests], axis=1),
              'transition': np.concatenate([r['transition'] for r in requests], axis=1),
              'observation': np.concatenate([r['observation'] for r in requests])}
    parsed = validate_request(merged, spec, num_envs, max_request_envs * len(requests))
  except (InvalidRequestError, KeyError, TypeError, ValueError, AttributeError,
          IndexError):
    return None
  lo = np.repeat([o.start for o in owned], sizes)
  hi = np.repeat([o.stop for o in owned], sizes)
  if (parsed.env_ids < lo).any() or (parsed.env_ids >= hi).any():
    return None
  modes = [_MODES[r.get('mode', 'train')] is Mode.EVAL for r in requests]
  return parsed._replace(eval_mask=np.repeat(modes, sizes))
