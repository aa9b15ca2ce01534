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
Acme's `VariableClient` (`CentralNode.get_variables`).
"""

import dataclasses
from typing import Any, Dict, List, Sequence

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


def check_report(report: Any) -> Dict[str, Any]:
  """Validates a `report_acting` payload; `InvalidRequestError` names what is wrong."""
  if not isinstance(report, dict):
    raise InvalidRequestError(f'report_acting expects a dict, got {type(report).__name__}')
  missing = [k for k in REPORT_FIELDS if k not in report]
  if missing:
    raise InvalidRequestError(f'report_acting: missing fields {missing}')
  try:
    ActingReport.from_wire(report)
    check_env_faults(report.get('env_faults', []))
  except (TypeError, ValueError) as e:
    raise InvalidRequestError(f'report_acting: {e}') from None
  return report
