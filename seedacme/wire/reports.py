"""What an actor that runs its own inference sends the central node: acting reports.

With actor-side inference (`ProgramConfig.inference = 'actor'`, the Acme baseline) the
central node serves no inference, so it cannot count acting from requests. Each actor
instead sends `report_acting(report)` every few seconds: the delta of its own acting
account since the last report (`ActingLog.take_report`, an `ActingReport`), plus its
inference batch statistics and trajectory-sink counters. `check_report` is what the
central node runs on every report before adding it: a malformed one fails only its
caller, as a bad inference request does.

A report may also carry `env_faults`: envs that raised or hung (`env_fault`), each
naming the env, its ids, the error's type and message. Every actor sends those, with
central inference too (a *fault report*: `fault_report`, no acting in it), so that the
central node's log says which env failed and the summary counts it; the actor then
exits and its supervisor restarts it on new seeds (`seedacme.actor.env_actor`).
`check_env_faults` bounds what a caller may send: a few short strings and ids.

`POLICY_VARIABLES` is the name of the variable collection such an actor pulls with
Acme's `VariableClient` (`CentralNode.get_variables`); `check_variable_names` bounds
that request, and so its reply (the policy's variables once).

Any authenticated peer can call `report_acting`, and what it says is summed into the
run's progress, budgets and targets, so every field is checked in type, shape and range
before anything is stored (`check_report`). Given the program (`ReportSources`) the
figures must also be ones that source's envs could report: its own mode's acting only,
batches of at most its envs, at most one episode per env step, |return| <= the reward
bound x length; `ReportIntake` adds a rate bound per source (`MAX_ENV_STEPS_PER_S`).
A real actor's reports are far inside all of these. A peer can still report plausible
figures that are false: the TLS boundary, not these checks, decides who may report.

Why ~370 lines: the report's wire form, and the checks of every field against the
program's sources (types, ranges, what a source could have stepped) that make the
intake safe to sum, are one contract; split, each half would restate the other's.
"""

import dataclasses
import math
import reprlib
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from seedacme.types import Episodes, Mode
from seedacme.wire.protocol import InvalidRequestError

POLICY_VARIABLES = 'policy'

# Field names of each mode's env steps and episodes ([2, n]: returns, lengths) on the wire.
_WIRE = {Mode.TRAIN: ('env_steps', 'train_episodes'),
         Mode.EVAL: ('eval_env_steps', 'eval_episodes')}
WIRE_FIELDS = tuple(k for keys in _WIRE.values() for k in keys)
# The rest of a report: who sent it, its batch statistics, its sink's counters.
REPORT_FIELDS = ('source', 'batches', 'units', 'full_batches', 'mean_latency_ms',
                 'p99_latency_ms', 'trajectory') + WIRE_FIELDS
OPTIONAL_REPORT_FIELDS = ('env_faults',)
# The trajectory sink's counters an actor sends (`ReverbSequenceSink.stats`, the one
# sink; tests/unit/test_report_validation.py holds them equal).
TRAJECTORY_STATS = ('sequences', 'items_written', 'writer_pending', 'writer_blocked_s',
                    'items_rewritten', 'writer_reconnects')
# Bounds for any program. Counts stay exact in float64; a latency of an hour is no
# batch's; an episode is at least one step (LAST after FIRST) and its length an int32.
MAX_COUNT = 2**53
MAX_LATENCY_MS = 3.6e6
MAX_EPISODE_LENGTH = 2**31 - 1
MAX_SOURCE = 2**31 - 1
# Envs one report may speak for when the program is not known (a request's bound,
# `InferenceServer(max_request_envs)`).
MAX_REPORT_ENVS = 4096
# Env steps a source's envs can take: per env, at most this many a second, in bursts of
# at most `BURST_S` seconds' worth (`ReportIntake`). An actor-side actor's env waits
# for its policy's call each step (>= ~100 us even for a tiny network: <= 10k/s); Catch
# with the V-trace MLP measured 150 steps/s per env here (K=4).
MAX_ENV_STEPS_PER_S = 20_000
BURST_S = 10.0
# |return| <= bound x length, up to float32 rounding of the rewards summed.
_RETURN_SLACK = 1 + 1e-6

# An env fault: what happened ('raised': the env raised; 'hung': a step exceeded the
# actor's limit), which actor, which env (its description and global ids), the error and the seed
# its actor gave the env. Text is cut to `MAX_FAULT_TEXT` characters on both sides.
ENV_FAULT_KINDS = ('raised', 'hung')
ENV_FAULT_FIELDS = ('kind', 'actor', 'env_name', 'env_ids', 'error_type', 'message',
                    'seed')
MAX_FAULT_TEXT = 500
MAX_FAULTS_PER_REPORT = 16
MAX_FAULT_ENV_IDS = 4096


def env_fault(kind: str, actor: str, env_name: str, env_ids: Sequence[int],
              error_type: str, message: str, seed: int) -> Dict[str, Any]:
  """One env fault as it goes on the wire (plain builtins); `actor` e.g. 'actor 3'."""
  return {'kind': kind, 'actor': str(actor)[:MAX_FAULT_TEXT],
          'env_name': str(env_name)[:MAX_FAULT_TEXT],
          'env_ids': [int(i) for i in env_ids][:MAX_FAULT_ENV_IDS],
          'error_type': str(error_type)[:MAX_FAULT_TEXT],
          'message': str(message)[:MAX_FAULT_TEXT], 'seed': int(seed)}


def check_env_faults(value: Any) -> List[Dict[str, Any]]:
  """A report's `env_faults`, checked; `ValueError` names what is wrong."""
  if not isinstance(value, (list, tuple)) or len(value) > MAX_FAULTS_PER_REPORT:
    raise ValueError(f'env_faults must be a list of at most {MAX_FAULTS_PER_REPORT} '
                     'faults')
  faults = []
  for fault in value:
    if not isinstance(fault, dict) or set(fault) != set(ENV_FAULT_FIELDS):
      raise ValueError(f'an env fault must be a dict with the fields {ENV_FAULT_FIELDS}')
    if fault['kind'] not in ENV_FAULT_KINDS:
      raise ValueError(f'env fault kind must be one of {ENV_FAULT_KINDS}')
    texts = [fault[k] for k in ('actor', 'env_name', 'error_type', 'message')]
    ids = fault['env_ids']
    if (not all(isinstance(t, str) and len(t) <= MAX_FAULT_TEXT for t in texts)
        or not isinstance(ids, list) or len(ids) > MAX_FAULT_ENV_IDS
        or not all(type(i) is int for i in ids) or type(fault['seed']) is not int):  # pylint: disable=unidiomatic-typecheck
      raise ValueError('an env fault holds strings of at most '
                       f'{MAX_FAULT_TEXT} characters, a list of int env ids and an int seed')
    faults.append(dict(fault))
  return faults


def fault_report(source: int, faults: List[Dict[str, Any]]) -> Dict[str, Any]:
  """A report of `faults` alone: no acting (what an actor with central inference sends)."""
  report = ActingReport({}, {}).to_wire()
  report.update(source=int(source), batches=0, units=0, full_batches=0,
                mean_latency_ms=0.0, p99_latency_ms=0.0, trajectory={},
                env_faults=list(faults))
  return report


def has_acting(report: Dict[str, Any]) -> bool:
  """Whether a (checked) report counts any acting: steps, episodes or batches."""
  acting = ActingReport.from_wire(report)
  return bool(int(report['batches']) or any(acting.env_steps.values())
              or any(len(e.returns) for e in acting.episodes.values()))


@dataclasses.dataclass
class ActingReport:
  """What some envs did since the last report, for one `ActingLog` to add up.

  Sent as a dict over Courier (`to_wire`, `from_wire`).
  """
  env_steps: Dict[Mode, int]
  episodes: Dict[Mode, Episodes]

  def to_wire(self) -> dict:
    wire = {}
    for mode, (steps_key, episodes_key) in _WIRE.items():
      e = self.episodes.get(mode, Episodes.none())
      wire[steps_key] = int(self.env_steps.get(mode, 0))
      wire[episodes_key] = np.stack([e.returns, e.lengths]).astype(np.float64)
    return wire

  @classmethod
  def from_wire(cls, wire: dict) -> 'ActingReport':
    """Reads `to_wire`'s dict; `ValueError` names the field when it is malformed."""
    steps, episodes = {}, {}
    for mode, (steps_key, episodes_key) in _WIRE.items():
      steps[mode] = int(wire[steps_key])
      value = np.asarray(wire[episodes_key], np.float64)
      if value.ndim != 2 or value.shape[0] != 2:
        raise ValueError(f'{episodes_key} must have shape [2, n] (returns, lengths), '
                         f'got {value.shape}')
      episodes[mode] = Episodes(np.zeros(value.shape[1], np.int64), value[0],
                                value[1].astype(np.int64))
    return cls(steps, episodes)


@dataclasses.dataclass(frozen=True)
class ReportSources:
  """Who reports in a program, and for how many envs (`seedacme.nodes.program`).

  Training actor i reports as `i * envs_per_actor` (its first env id) for its
  `envs_per_actor` envs, training acting only; the evaluator as `num_actors *
  envs_per_actor` for its `num_eval_envs` envs, evaluation acting only. A report of env
  faults alone (`fault_report`) names its actor's index instead (nothing is kept per
  such source). `max_abs_reward`: the program's reward bound (`EnvSpec.max_abs_reward`).
  """
  num_actors: int
  envs_per_actor: int
  num_eval_envs: int = 0
  max_abs_reward: float = math.inf

  def acting(self, source: int) -> Tuple[int, Mode] | None:
    """(envs, mode) of the actor that reports acting as `source`; None if none does."""
    train = self.num_actors * self.envs_per_actor
    if 0 <= source < train and source % self.envs_per_actor == 0:
      return self.envs_per_actor, Mode.TRAIN
    if self.num_eval_envs and source == train:
      return self.num_eval_envs, Mode.EVAL
    return None

  def acting_sources(self) -> Dict[int, Tuple[int, Mode]]:
    train = self.num_actors * self.envs_per_actor
    sources = {i: (self.envs_per_actor, Mode.TRAIN)
               for i in range(0, train, self.envs_per_actor)}
    if self.num_eval_envs:
      sources[train] = (self.num_eval_envs, Mode.EVAL)
    return sources


def _refuse(field: str, what: str):
  raise InvalidRequestError(f'report_acting: {field} {what}')


def _short(value: Any) -> str:
  """A short repr (`reprlib`: a huge value is not rendered whole; nor an int, whose
  decimal form past 4,300 digits raises)."""
  if isinstance(value, int) and abs(value) >= 10**40:
    return f'an int of {value.bit_length()} bits'
  return reprlib.repr(value)


def _show(value: Any) -> str:
  return f'{type(value).__name__} {_short(value)}'


def _int(report: Dict[str, Any], field: str, hi: int = MAX_COUNT) -> int:
  value = report[field]
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    _refuse(field, f'must be an int, got {_show(value)}')
  if not 0 <= value <= hi:
    _refuse(field, f'must lie in [0, {hi}], got {_short(value)}')
  return int(value)


def _number(field: str, value: Any, hi: float) -> float:
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, float, np.integer, np.floating)):
    _refuse(field, f'must be a number, got {_show(value)}')
  # An int is compared as it is (a huge one would overflow a float conversion).
  ok = 0 <= value <= hi if isinstance(value, (int, np.integer)) else \
      math.isfinite(value) and 0 <= value <= hi
  if not ok:
    _refuse(field, f'must be finite and in [0, {hi:g}], got {_short(value)}')
  return int(value) if isinstance(value, (int, np.integer)) else float(value)


def _trajectory(value: Any) -> Dict[str, float]:
  if not isinstance(value, dict):
    _refuse('trajectory', f'must be a dict of sink counters, got {_show(value)}')
  unknown = [k for k in value if k not in TRAJECTORY_STATS]
  if unknown:
    _refuse('trajectory', f'has unknown counters {reprlib.repr(unknown)}; '
            f'known: {list(TRAJECTORY_STATS)}')
  return {k: _number(f'trajectory[{k!r}]', v, MAX_COUNT) for k, v in value.items()}


def _episodes(report: Dict[str, Any], field: str, steps_field: str, steps: int,
              envs: int, max_abs_reward: float) -> np.ndarray:
  """`field`'s [2, n] returns and lengths: at most one episode per env step reported
  (and one per env more: its last step may have gone in the previous report)."""
  value = report[field]
  if not isinstance(value, np.ndarray) or value.dtype.kind not in 'iuf':
    _refuse(field, f'must be a numeric array [2, n] (returns; lengths), got {_show(value)}'
            if not isinstance(value, np.ndarray) else
            f'must be a numeric array [2, n] (returns; lengths), got dtype {value.dtype}')
  if value.ndim != 2 or value.shape[0] != 2:
    _refuse(field, f'must have shape [2, n] (returns, lengths), got {value.shape}')
  n = value.shape[1]
  if n > steps + envs:
    _refuse(field, f'has {n} episodes with {steps_field} {steps}: an episode ends with a '
            f'step, at most {steps + envs} here ({envs} envs)')
  value = value.astype(np.float64)
  returns, lengths = value
  if not np.isfinite(returns).all():
    _refuse(field, 'returns (row 0) must be finite')
  if not (np.isfinite(lengths).all() and (lengths == np.rint(lengths)).all()
          and (lengths >= 1).all() and (lengths <= MAX_EPISODE_LENGTH).all()):
    _refuse(field, f'lengths (row 1) must be whole numbers in [1, {MAX_EPISODE_LENGTH}]')
  over = np.abs(returns) > max_abs_reward * lengths * _RETURN_SLACK
  if over.any():
    i = int(np.argmax(over))
    _refuse(field, f'return {returns[i]:g} of an episode of {int(lengths[i])} steps '
            f'exceeds the reward bound {max_abs_reward:g} per step (EnvSpec.max_abs_reward)')
  return value


def check_report(report: Any, sources: ReportSources | None = None,
                 acting_allowed: bool = True) -> Dict[str, Any]:
  """Validates a `report_acting` payload field by field; returns it in canonical form
  (Python ints and floats, float64 episode arrays of its own, a trajectory dict of
  known counters), which is all that is stored or summed.

  `sources`: the program's; then the source must be an actor's and the figures what
  its envs can report. Without it, only what holds in any program is checked.
  `acting_allowed` False (central inference): a report may carry env faults only.

  Raises:
    InvalidRequestError: 'report_acting: <field> ...', naming the first field wrong.
  """
  if not isinstance(report, dict):
    raise InvalidRequestError(f'report_acting expects a dict, got {type(report).__name__}')
  missing = [k for k in REPORT_FIELDS if k not in report]
  if missing:
    raise InvalidRequestError(f'report_acting: missing fields {missing}')
  unknown = [k for k in report if k not in REPORT_FIELDS + OPTIONAL_REPORT_FIELDS]
  if unknown:
    raise InvalidRequestError(
        f'report_acting: unknown fields {reprlib.repr(unknown)}')
  checked = {'source': _int(report, 'source', MAX_SOURCE)}
  for field in ('batches', 'units', 'full_batches') + tuple(s for s, _ in _WIRE.values()):
    checked[field] = _int(report, field)
  for field in ('mean_latency_ms', 'p99_latency_ms'):
    checked[field] = float(_number(field, report[field], MAX_LATENCY_MS))
  checked['trajectory'] = _trajectory(report['trajectory'])
  source = checked['source']
  acting = sources.acting(source) if sources is not None else None
  envs = acting[0] if acting is not None else MAX_REPORT_ENVS
  bound = sources.max_abs_reward if sources is not None else math.inf
  for steps_field, episodes_field in _WIRE.values():
    checked[episodes_field] = _episodes(report, episodes_field, steps_field,
                                        checked[steps_field], envs, bound)
  try:
    checked['env_faults'] = check_env_faults(report.get('env_faults', []))
  except (TypeError, ValueError) as e:
    raise InvalidRequestError(f'report_acting: env_faults: {e}') from None
  counts_acting = has_acting(checked) or bool(checked['trajectory'])
  if counts_acting and not acting_allowed:
    raise InvalidRequestError('report_acting: this program runs central inference, '
                              'which counts acting itself; reports carry env faults only')
  batches, units = checked['batches'], checked['units']
  if checked['full_batches'] > batches:
    _refuse('full_batches', f'{checked["full_batches"]} exceed batches {batches}')
  if not batches <= units <= batches * envs:
    _refuse('units', f'{units} must lie in [batches, batches x {envs} envs] = '
            f'[{batches}, {batches * envs}]')
  if sources is None:
    return checked
  if acting is None:
    if counts_acting:
      _refuse('source', f'{source} is no actor\'s first env id (actors report as '
              f'{reprlib.repr(sorted(sources.acting_sources()))}); only a report of env '
              'faults alone may name another')
    return checked
  mode = acting[1]
  for other, (steps_field, episodes_field) in _WIRE.items():
    if other is mode:
      continue
    if checked[steps_field]:
      _refuse(steps_field, f'must be 0 from source {source}, whose envs are in '
              f'{mode.value} mode')
    if checked[episodes_field].shape[1]:
      _refuse(episodes_field, f'must be empty from source {source}, whose envs are in '
              f'{mode.value} mode')
  steps_field = _WIRE[mode][0]
  if units > checked[steps_field] + 2 * envs:
    _refuse('units', f'{units} exceed {steps_field} {checked[steps_field]} + 2 x {envs} '
            'envs (each env served is an env step)')
  return checked


VARIABLE_COLLECTIONS = (POLICY_VARIABLES,)
MAX_VARIABLE_NAME = 64


def check_variable_names(names: Any) -> List[str]:
  """A `get_variables` request: distinct names of collections the central node serves
  (Acme's `VariableClient` sends `[POLICY_VARIABLES]`), so the reply holds each
  collection at most once. `InvalidRequestError` names what is wrong."""
  if not isinstance(names, (list, tuple)):
    raise InvalidRequestError(
        f'get_variables: names must be a list of collection names, got {_show(names)}')
  if not 1 <= len(names) <= len(VARIABLE_COLLECTIONS):
    raise InvalidRequestError(
        f'get_variables: names must hold 1 to {len(VARIABLE_COLLECTIONS)} distinct names '
        f'of {list(VARIABLE_COLLECTIONS)}, got {len(names)}')
  for i, name in enumerate(names):
    if not isinstance(name, str) or len(name) > MAX_VARIABLE_NAME:
      raise InvalidRequestError(f'get_variables: names[{i}] must be a string of at most '
                                f'{MAX_VARIABLE_NAME} characters, got {_show(name)}')
    if name not in VARIABLE_COLLECTIONS:
      raise InvalidRequestError(f'get_variables: names[{i}] {name!r} is unknown; the '
                                f'central node serves {list(VARIABLE_COLLECTIONS)}')
  if len(set(names)) != len(names):
    raise InvalidRequestError(f'get_variables: names are repeated: {list(names)}')
  return list(names)
