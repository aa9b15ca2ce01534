"""The inference server: batched central inference with server-side env state.

This is where the batch gets formed (`RequestBatcher`) and where each env's state
lives (`EnvStateTable`). Per inference batch the server

1. validates each request (`protocol.validate_request`) on the caller's thread -- a bad
   request fails only its caller;
2. joins requests from many actors into one batch;
3. resets the state of envs whose run id changed (actor restart: recurrent state back
   to initial, partial unroll dropped) and of envs starting an episode;
4. runs the policy ONCE for the whole batch;
5. appends each training env's step to its trajectory (completed sequences go to
   Reverb) and records finished episodes;
6. returns each caller its slice of the actions.
"""

import collections
import threading
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import dm_env
import numpy as np
import tree

from seedacme import batcher as batcher_lib
from seedacme import protocol
from seedacme.envs.registry import EnvSpec
from seedacme.lifecycle import ShutdownError
from seedacme.policy import ServerPolicy

Nest = Any

_FIRST = int(dm_env.StepType.FIRST)
_LAST = int(dm_env.StepType.LAST)


class EnvStateTable:
  """Server-side state of every env, keyed by global env id."""

  def __init__(self, num_envs: int, initial_state: Nest):
    """`initial_state` is the policy's state for ONE env (leaves `[1, ...]`)."""
    self.num_envs = num_envs
    self._initial = initial_state
    self.state = tree.map_structure(
        lambda x: np.repeat(np.asarray(x), num_envs, axis=0), initial_state)
    self.run_ids = np.full(num_envs, -1, np.int64)
    self.prev_action = np.zeros(num_envs, np.int32)
    self.episode_return = np.zeros(num_envs, np.float64)
    self.episode_length = np.zeros(num_envs, np.int64)

  def reset(self, env_ids: np.ndarray) -> None:
    """Back to the initial recurrent state (start of an episode or a new actor run)."""
    if env_ids.size == 0:
      return
    for leaf, init in zip(tree.flatten(self.state), tree.flatten(self._initial)):
      leaf[env_ids] = init
    self.prev_action[env_ids] = 0

  def gather(self, env_ids: np.ndarray) -> Nest:
    return tree.map_structure(lambda x: x[env_ids], self.state)

  def scatter(self, env_ids: np.ndarray, state: Nest) -> None:
    for leaf, new in zip(tree.flatten(self.state), tree.flatten(state)):
      leaf[env_ids] = new


class EpisodeLog:
  """Finished episodes seen by the server, kept apart for training and evaluation."""

  def __init__(self, window: int = 100, eval_window: int = 20):
    """Averages cover the last `window` training / `eval_window` evaluation episodes."""
    self._lock = threading.Lock()
    self.returns = {False: collections.deque(maxlen=window),
                    True: collections.deque(maxlen=eval_window)}
    self.lengths = {False: collections.deque(maxlen=window),
                    True: collections.deque(maxlen=eval_window)}
    self.episodes = {False: 0, True: 0}
    # Called with every recorded batch (actor-side inference forwards them to the
    # central node's progress).
    self.listener: Callable[[bool, np.ndarray, np.ndarray], None] | None = None

  def record(self, greedy: bool, returns: np.ndarray, lengths: np.ndarray) -> None:
    with self._lock:
      self.returns[greedy].extend(returns.tolist())
      self.lengths[greedy].extend(lengths.tolist())
      self.episodes[greedy] += len(returns)
    if self.listener is not None:
      self.listener(greedy, returns, lengths)

  def summary(self, greedy: bool) -> Dict[str, float]:
    with self._lock:
      r = list(self.returns[greedy])
      n = list(self.lengths[greedy])
      return {'episodes': self.episodes[greedy],
              'average_return': float(np.mean(r)) if r else float('nan'),
              'average_length': float(np.mean(n)) if n else float('nan')}


class InferenceServer:
  """Serves `step(request)` for all actors of a program from one batched policy."""

  def __init__(self, policy: ServerPolicy, spec: EnvSpec, num_envs: int,
               trajectory_sink=None, max_batch_envs: int | None = None,
               batch_timeout_s: float = 0.002, max_request_envs: int = 4096):
    """Creates the server and starts its batching thread.

    Args:
      policy: the agent's batched policy.
      spec: the env spec every request is checked against.
      num_envs: global env ids are 0..num_envs-1 (actors' and evaluators').
      trajectory_sink: has `add(env_ids, step)` and `reset(env_ids)` (a
        `trajectories.SequenceAssembler`); None to serve without recording.
      max_batch_envs: run the policy once this many envs are waiting (default: all).
      batch_timeout_s: ... or once this long has passed since the batch's first request.
      max_request_envs: refuse requests with more envs than this (payload bound).
    """
    self._policy = policy
    self._spec = spec
    self._num_envs = num_envs
    self._sink = trajectory_sink
    self._max_request_envs = max_request_envs
    self._table = EnvStateTable(num_envs, policy.initial_state(1))
    self.episodes = EpisodeLog()
    self.env_steps = 0  # training env steps served
    self.eval_env_steps = 0
    self.actor_restarts = 0
    self.requests_refused = 0
    self._batcher = batcher_lib.RequestBatcher(
        self._process, max_batch_size=max_batch_envs or num_envs,
        timeout_s=batch_timeout_s, name='inference-batcher')

  # Called concurrently from Courier handler threads.
  def step(self, request: Dict[str, Any]) -> Dict[str, np.ndarray]:
    try:
      parsed = protocol.validate_request(request, self._spec, self._num_envs,
                                         self._max_request_envs)
    except protocol.InvalidRequestError:
      self.requests_refused += 1
      raise
    try:
      return self._batcher(parsed, parsed.size)
    except ShutdownError as e:
      # Orderly shutdown: a reply, not an exception (Courier would log a traceback).
      return {'shutting_down': str(e)}

  def _process(self, requests: Sequence[protocol.Request]) -> List[Any]:
    """Runs on the batcher thread: one policy call for all accepted requests."""
    results: List[Any] = [None] * len(requests)
    accepted, seen = [], set()
    for i, r in enumerate(requests):
      clash = seen.intersection(r.env_ids.tolist())
      if clash:
        self.requests_refused += 1
        results[i] = protocol.InvalidRequestError(
            f'env_ids {sorted(clash)} already have a step in flight in this batch '
            '(two concurrent calls for the same env)')
        continue
      seen.update(r.env_ids.tolist())
      accepted.append(i)
    if not accepted:
      return results

    batch = [requests[i] for i in accepted]
    env_ids = np.concatenate([r.env_ids for r in batch])
    run_ids = np.concatenate([r.run_ids for r in batch])
    step_type = np.concatenate([r.step_type for r in batch])
    reward = np.concatenate([r.reward for r in batch])
    discount = np.concatenate([r.discount for r in batch])
    observation = np.concatenate([r.observation for r in batch])
    greedy = np.concatenate([np.full(r.size, r.greedy) for r in batch])
    self._reset_restarted_envs(env_ids, run_ids)
    self._track_episodes(env_ids, step_type, reward)

    state = self._table.gather(env_ids)
    out = self._policy.step(observation, state, greedy, env_ids)
    action = np.asarray(out.action, np.int32)

    train = ~greedy
    if self._sink is not None and train.any():
      step = {'observation': observation[train], 'reward': reward[train],
              'discount': discount[train], 'step_type': step_type[train],
              'action': action[train],
              'extras': {k: np.asarray(v)[train] for k, v in out.extras.items()},
              'state': tree.map_structure(lambda x: x[train], state)}
      self._sink.add(env_ids[train], step)
    self._table.scatter(env_ids, out.state)
    self._table.prev_action[env_ids] = action
    self._record_finished_episodes(env_ids, step_type, greedy)
    self.env_steps += int(train.sum())
    self.eval_env_steps += int((~train).sum())

    offset = 0
    for i, r in zip(accepted, batch):
      results[i] = {'action': action[offset:offset + r.size]}
      offset += r.size
    return results

  def _reset_restarted_envs(self, env_ids: np.ndarray, run_ids: np.ndarray) -> None:
    """A changed run id means the actor restarted: fresh state, partial unroll dropped."""
    table = self._table
    changed = table.run_ids[env_ids] != run_ids
    restarted = env_ids[changed]
    if not restarted.size:
      return
    known = restarted[table.run_ids[restarted] >= 0]
    if known.size:
      self.actor_restarts += 1
      logging.info('Run id changed for %d envs (actor restart): resetting their '
                   'state and dropping partial trajectories', known.size)
    table.run_ids[restarted] = run_ids[changed]
    table.reset(restarted)
    table.episode_return[restarted] = 0
    table.episode_length[restarted] = 0
    if self._sink is not None:
      self._sink.reset(restarted)

  def _track_episodes(self, env_ids: np.ndarray, step_type: np.ndarray,
                      reward: np.ndarray) -> None:
    """Episode starts reset the recurrent state; returns and lengths accumulate."""
    table = self._table
    first = step_type == _FIRST
    table.reset(env_ids[first])
    table.episode_return[env_ids[first]] = 0
    table.episode_length[env_ids[first]] = 0
    table.episode_return[env_ids[~first]] += reward[~first]
    table.episode_length[env_ids[~first]] += 1

  def _record_finished_episodes(self, env_ids: np.ndarray, step_type: np.ndarray,
                                greedy: np.ndarray) -> None:
    last = step_type == _LAST
    for is_greedy in (False, True):
      ended = env_ids[last & (greedy == is_greedy)]
      if ended.size:
        self.episodes.record(is_greedy, self._table.episode_return[ended],
                             self._table.episode_length[ended])

  def trajectory_stats(self) -> Dict[str, float]:
    """The trajectory sink's counters ({} when serving without recording)."""
    return self._sink.stats() if self._sink is not None else {}

  def batch_stats(self, reset: bool = False) -> batcher_lib.BatcherStats:
    return self._batcher.stats(reset)

  @property
  def max_batch_envs(self) -> int:
    return self._batcher.max_batch_size

  def stop_intake(self) -> None:
    """New requests get a `shutting_down` reply; the batch in flight may finish."""
    self._batcher.stop_intake()

  def close(self) -> None:
    self._batcher.close()
