"""What an actor that runs its own inference sends the central node: acting reports.

With actor-side inference (`ProgramConfig.inference = 'actor'`, the Acme baseline) the
central node serves no inference, so it cannot count acting from requests. Each actor
instead sends `report_acting(report)` every few seconds: the delta of its own acting
account since the last report (`ActingLog.take_report`, an `ActingReport`), plus its
inference batch statistics and trajectory-sink counters. `check_report` is what the
central node runs on every report before adding it: a malformed one fails only its
caller, as a bad inference request does.

`POLICY_VARIABLES` is the name of the variable collection such an actor pulls with
Acme's `VariableClient` (`CentralNode.get_variables`).
"""

import dataclasses
from typing import Any, Dict

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
  except (TypeError, ValueError) as e:
    raise InvalidRequestError(f'report_acting: {e}') from None
  return report
