"""Which actors the central node is hearing from, and through which transport.

Across hosts an actor can be partitioned away, lost with its host, or rejoin; only the
central node sees all of them, by the requests it serves. `EnvContacts` keeps, per
global env id, when a request for it was last served and how it came (shared memory
or Courier); `actor_status` turns that into what a progress record and the summary
say: how many actors are serving now (a request served within the window), and each
replica's transport (`{'actor/0': 'courier', 'actor/1': 'shm', 'evaluator/0': ...}`).

Per env, not per actor, because the server sees env ids (an actor's range, or half of
it with a half-batch engine) and the mapping to actors is the program's. Marking is
two numpy slice stores per served request (~1 us next to a ~1 ms batch step), so it
is always on. An actor's own inference (`inference='actor'`) is marked from its
acting reports instead, as 'actor-side'.
"""

import time
from typing import Any, Dict

import numpy as np

TRANSPORTS = ('courier', 'shm', 'actor-side')
_NONE = -1


class EnvContacts:
  """Per env id: when a request for it was last served, and through what."""

  def __init__(self, num_envs: int):
    self._at = np.full(num_envs, -np.inf)
    self._via = np.full(num_envs, _NONE, np.int8)

  def mark(self, envs: Any, transport: str, now: float | None = None) -> None:
    """`envs`: env ids (an array) or a `range` of them."""
    if isinstance(envs, range):
      envs = slice(envs.start, envs.stop)
    self._at[envs] = time.monotonic() if now is None else now
    self._via[envs] = TRANSPORTS.index(transport)

  def last(self, envs: slice) -> tuple:
    """(seconds since any of `envs` was served, its transport) or (inf, None)."""
    at = self._at[envs]
    if not at.size or not np.isfinite(at.max()):
      return float('inf'), None
    i = int(np.argmax(at))
    return time.monotonic() - float(at[i]), TRANSPORTS[int(self._via[envs][i])]


def actor_status(contacts: EnvContacts, num_actors: int, envs_per_actor: int,
                 num_eval_envs: int, within_s: float) -> Dict[str, Any]:
  """Record fields: actors serving within `within_s`, of how many, per transport, and
  each replica's last transport (None: never heard from)."""
  replicas = {f'actor/{i}': slice(i * envs_per_actor, (i + 1) * envs_per_actor)
              for i in range(num_actors)}
  if num_eval_envs:
    first = num_actors * envs_per_actor
    replicas['evaluator/0'] = slice(first, first + num_eval_envs)
  transports, serving = {}, {}
  for name, envs in replicas.items():
    age, via = contacts.last(envs)
    transports[name] = via
    serving[name] = age <= within_s
  actors = [n for n in replicas if n.startswith('actor/')]
  status = {'actors': num_actors, 'actors_serving': sum(serving[n] for n in actors)}
  for t in TRANSPORTS:
    status[f'actors_{t.replace("-", "_")}'] = sum(serving[n] and transports[n] == t
                                                   for n in actors)
  if num_eval_envs:
    status['evaluator_serving'] = int(serving['evaluator/0'])
  status['transports'] = transports
  return status
