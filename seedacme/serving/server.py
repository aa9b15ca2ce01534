"""The inference server: batched central inference with server-side env state.

This is where the batch gets formed (`RequestBatcher`). Per inference batch the server

1. validates each request (`protocol.validate_request`) on the caller's thread -- a bad
   request fails only its caller;
2. joins requests from many actors into one batch;
3. marks for reset the envs whose run id changed (actor restart: recurrent state back
   to initial, partial unroll dropped) and the envs starting an episode;
4. runs the policy's batch step ONCE for the whole batch (the policy keeps each env's
   recurrent state, on the device: `seedacme.serving.tf_policy`);
5. appends each training env's step to its trajectory (completed sequences go to
   Reverb) and counts served steps and finished episodes in the acting account it was
   given (the central node's `ActingLog`; none for an actor's own inference, whose
   actor counts its envs itself);
6. returns each caller its slice of the actions.
Actions no env may take (`InvalidActionError`) fail the run, not a caller: every caller
gets `shutting_down` from then on, and `policy_error` becomes the run's stop reason.

A reproducible run gives the server a `RoundGate` (`seedacme.serving.rounds`): batches
are then whole rounds' calls (`RoundBatcher`: one request of every training env, or
evaluation requests alone), their rows put in env-id order for the policy, the sink and
the account, and a round's first call waits for the learner (the version barrier).
Training requests must then hold training envs only, evaluation requests evaluator envs
only (refused by name otherwise: an evaluator row would move a training env's state).
With the reproducible evaluator (`evaluation`, `seedacme.serving.evaluation`) an
evaluation request holds every evaluator env and is served by its own policy (the
weights of its pass, a copy) outside the batcher, one at a time: it may wait for its
pass's round without holding up a training batch, and a round's start may wait for it
without holding up the evaluator.

A reproducible run's round checkpoints save and restore what serving the training
envs goes on from (`round_state`, `restore_round_state`: the gate's call count, the
policy's acting state, the partial unrolls, the episodes in progress and the training
counts; `seedacme.run.resume`); restored envs take their actors' new run ids without
starting over.

Why ~550 lines: the batch step's six stages (above), its refusal paths, the round
gate's ordering and the round state are one pipeline over one batcher.
"""

import threading
from typing import Any, Callable, Dict, List, Sequence, Tuple

from absl import logging
import numpy as np
import tree

from seedacme.run.accounting import ActingLog, EpisodeTracker
from seedacme.run.contacts import EnvContacts
from seedacme.runtime.lifecycle import ShutdownError
from seedacme.serving import batcher as batcher_lib
from seedacme.serving.evaluation import EvalPasses
from seedacme.serving.policy import ServerPolicy
from seedacme.serving.rounds import RoundGate
from seedacme.types import FIRST, LAST, EnvSpec, Episodes, InvalidActionError, Mode
from seedacme.wire import protocol


# A training env's run id after a round checkpoint was restored: its actor's next run
# id is taken without starting the env over (`restore_round_state`).
RESTORED = -2


class InferenceServer:
  """Serves `step(request)` for all actors of a program from one batched policy."""

  def __init__(self, policy: ServerPolicy, spec: EnvSpec, num_envs: int,
               trajectory_sink=None, max_batch_envs: int | None = None,
               batch_timeout_s: float = 0.002, max_request_envs: int = 4096,
               batch_capacity: int | None = None, acting: ActingLog | None = None,
               rounds: RoundGate | None = None):
    """Creates the server (no thread of its own: see `seedacme.serving.batcher`).

    Args:
      policy: the agent's batched policy; it holds the state of `num_envs` envs.
      spec: the env spec every request is checked against.
      num_envs: global env ids are 0..num_envs-1 (actors' and evaluators').
      trajectory_sink: has `add(env_ids, step)` and `reset(env_ids)` (a
        `trajectories.SequenceAssembler`); None to serve without recording.
      max_batch_envs: run the policy as soon as it is free and this many envs are
        waiting (1: whatever is queued when the policy becomes free; default: all).
      batch_timeout_s: ... or once the batch's first request has waited this long.
      max_request_envs: refuse requests with more envs than this (payload bound).
      batch_capacity: the most envs one batch can hold, for the reported fill
        (default `num_envs`: every env has at most one step in flight).
      acting: where served steps and finished episodes are counted (None: not
        counted here -- an actor's own inference, whose actor counts its envs).
      rounds: a reproducible run's round gate (module docstring); its training envs
        are 0..rounds.num_envs-1, the rest are the evaluator's.
    """
    if getattr(policy, 'num_envs', num_envs) < num_envs:
      raise ValueError(f'the policy holds state for {policy.num_envs} envs; the server '
                       f'serves {num_envs}')
    self._policy = policy
    self._spec = spec
    self._num_envs = num_envs
    self._sink = trajectory_sink
    self._max_request_envs = max_request_envs
    self.batch_capacity = batch_capacity or num_envs
    # Per global env id, its actor's run id (-1: never seen). The recurrent state
    # lives with the policy, on the device; the episode in progress with the account.
    self._run_ids = np.full(num_envs, -1, np.int64)
    self.acting = acting
    self._episodes = EpisodeTracker(num_envs) if acting is not None else None
    self.actor_restarts = self.requests_refused = 0
    self.policy_error: str | None = None  # set once the policy's actions were refused
    self.contacts = EnvContacts(num_envs)  # who is heard from, through what
    self._batch_timeout_s = batch_timeout_s
    self.rounds = rounds
    if rounds is None:
      self._batcher = batcher_lib.RequestBatcher(
          self._process, max_batch_size=max_batch_envs or num_envs,
          timeout_s=batch_timeout_s, name='inference-batcher')
    else:
      if not 0 < rounds.num_envs <= num_envs:
        raise ValueError(f'the round gate has {rounds.num_envs} training envs; the server '
                         f'serves {num_envs} envs')
      self._batcher = batcher_lib.RoundBatcher(
          self._process, rounds.num_envs, keys=self._round_key, name='inference-rounds')
    self._held_seen = 0  # `RoundBatcher.held` already recorded as not exact
    self._evaluation: EvalPasses | None = None  # `evaluate_with`
    self._eval_policy: ServerPolicy | None = None
    self._eval_lock = threading.Lock()  # one evaluator call at a time
    # Before each evaluator call (its count, env ids), on its thread: the central
    # node's round checkpoints save the evaluator's state at checkpoint rounds.
    self.on_eval_call: Callable[[int, np.ndarray], None] | None = None
    self._eval_episodes = EpisodeTracker(num_envs) if acting is not None else None

  def evaluate_with(self, evaluation: EvalPasses, eval_policy: ServerPolicy) -> None:
    """A reproducible run's evaluator (module docstring): `evaluation` decides which
    weights each pass plays, `eval_policy` (its own copy of the weights, and the
    evaluator envs' state) plays them. Before serving starts."""
    if self.rounds is None:
      raise ValueError('the reproducible evaluator needs a round gate')
    if self.rounds.num_envs + evaluation.num_envs != self._num_envs:
      raise ValueError(f'{evaluation.num_envs} evaluator envs after '
                       f'{self.rounds.num_envs} training envs; the server serves '
                       f'{self._num_envs}')
    if getattr(eval_policy, 'num_envs', self._num_envs) < self._num_envs:
      raise ValueError(f'the eval policy holds state for {eval_policy.num_envs} envs; '
                       f'the server serves {self._num_envs}')
    self._evaluation, self._eval_policy = evaluation, eval_policy
    self.rounds.evaluation = evaluation

  @property
  def evaluation(self) -> EvalPasses | None:
    """The reproducible evaluator's passes (None: evaluation as any request)."""
    return self._evaluation

  def _parse(self, request: Dict[str, Any], owned: range | None) -> protocol.Request:
    """Validates one request (and, for a shared-memory caller, that it keeps to the
    env ids `owned` it attached with); a refusal is counted and raised."""
    try:
      parsed = protocol.validate_request(request, self._spec, self._num_envs,
                                         self._max_request_envs)
      if owned is not None and (parsed.env_ids.min() < owned.start or
                                parsed.env_ids.max() >= owned.stop):
        bad = [i for i in parsed.env_ids.tolist() if i not in owned]
        raise protocol.InvalidRequestError(
            f'env_ids {bad} are not this actor\'s: it attached with env ids '
            f'{owned.start}..{owned.stop - 1}')
      if self.rounds is not None:
        self._check_round_envs(parsed)
    except protocol.InvalidRequestError:
      self.requests_refused += 1
      raise
    return parsed

  def _check_round_envs(self, parsed: protocol.Request) -> None:
    """With a round gate: training requests hold training envs only, evaluation
    requests evaluator envs only."""
    n = self.rounds.num_envs
    evaluating = parsed.mode is Mode.EVAL
    bad = parsed.env_ids[(parsed.env_ids < n) if evaluating else (parsed.env_ids >= n)]
    if bad.size:
      kind, envs = ('evaluation', f'the evaluator\'s envs {n}..{self._num_envs - 1}') \
          if evaluating else ('training', f'the training envs 0..{n - 1}')
      raise protocol.InvalidRequestError(
          f'a {kind} request for env_ids {sorted(set(bad.tolist()))[:16]}: a reproducible '
          f'run serves {kind} requests for {envs} only')

  @staticmethod
  def _round_key(group: Sequence[protocol.Request]) -> np.ndarray | None:
    """What the `RoundBatcher` needs of a batcher entry: its training env ids, or None
    for evaluation."""
    modes = {r.mode for r in group}
    if modes == {Mode.EVAL}:
      return None
    if modes != {Mode.TRAIN}:
      raise protocol.InvalidRequestError(
          'a reproducible run serves training and evaluation requests in separate '
          'batches: one entry may not mix them')
    return np.concatenate([r.env_ids for r in group])

  @property
  def round_stop(self) -> Any:
    """The stop reason the round hook gave (the run ends at a round's start), or None."""
    return self.rounds.stop if self.rounds is not None else None

  # Called concurrently from Courier handler threads.
  def step(self, request: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Serves one actor's request (a Courier call)."""
    parsed = self._parse(request, None)
    self.contacts.mark(parsed.env_ids, 'courier')
    if self._evaluation is not None and parsed.mode is Mode.EVAL:
      return self._serve_evaluation(parsed)
    try:
      reply = self._batcher([parsed], parsed.size)[0]
    except ShutdownError as e:
      # Orderly shutdown: a reply, not an exception (Courier would log a traceback).
      return {'shutting_down': str(e)}
    if isinstance(reply, BaseException):
      raise reply  # refused inside the batch (its env already had a step in flight)
    return reply

  def serve_group(self, requests: Sequence[Dict[str, Any]],
                  owned: Sequence[range]) -> List[Any]:
    """Serves the requests of several actors that are ready together (the
    shared-memory server's: one batcher entry, no thread per actor, and no waiting
    for more: its caller already waited for the batch to fill, `batch_wait`).
    Each request, a lone one included, is served from the arrays it holds: they must
    be private (`shm.Segment.request` copies them out of the actor's segment).
    Returns, per request, its reply or the `InvalidRequestError` refusing it."""
    for envs in owned:
      self.contacts.mark(envs, 'shm')
    if len(requests) > 1 and self.rounds is None:
      merged = protocol.merge_requests(requests, self._spec, self._num_envs,
                                       self._max_request_envs, owned)
      if merged is not None:  # all valid: one request, validated in one pass
        try:
          reply = self._batcher([merged], merged.size, eager=True)[0]
        except ShutdownError as e:
          return [{'shutting_down': str(e)}] * len(requests)
        if isinstance(reply, dict) and 'shutting_down' in reply:
          return [reply] * len(requests)  # e.g. the policy's actions were refused
        if not isinstance(reply, BaseException):
          out, at = [], 0
          for r in requests:
            k = r['ids'].shape[1]
            out.append({'action': reply['action'][at:at + k]})
            at += k
          return out
        # Refused inside the batch (an env in flight twice): one by one below.
    results: List[Any] = [None] * len(requests)
    parsed, where = [], []
    for i, (request, envs) in enumerate(zip(requests, owned)):
      try:
        one = self._parse(request, envs)
        if self._evaluation is not None and one.mode is Mode.EVAL:
          results[i] = self._serve_evaluation(one)
          continue
        parsed.append(one)
        where.append(i)
      except protocol.InvalidRequestError as e:
        results[i] = e
    if parsed:
      try:
        replies = self._batcher(parsed, sum(r.size for r in parsed), eager=True)
      except ShutdownError as e:
        replies = [{'shutting_down': str(e)}] * len(parsed)
      except protocol.InvalidRequestError as e:  # a round gate's: mixed modes
        replies = [e] * len(parsed)
      for i, reply in zip(where, replies):
        results[i] = reply
    return results

  def _process(self, groups: Sequence[Sequence[protocol.Request]]) -> List[Any]:
    """Runs on the batch's leader thread: one policy call for every request of the
    batch's entries (a Courier call's one request, or a shared-memory group); each
    entry gets back the list of its requests' replies (or refusals)."""
    flat = [r for group in groups for r in group]
    results = self._process_requests(flat)
    out, at = [], 0
    for group in groups:
      out.append(results[at:at + len(group)])
      at += len(group)
    return out

  def _process_requests(self, requests: Sequence[protocol.Request]) -> List[Any]:
    """One policy call for all of `requests` that can run together; per request, its
    reply or the refusal of a second request for an env already in the batch."""
    results: List[Any] = [None] * len(requests)
    accepted, seen = [], set()
    for i, r in enumerate(requests):
      ids = r.env_ids.tolist()
      clash = seen.intersection(ids)
      if clash:
        self.requests_refused += 1
        results[i] = protocol.InvalidRequestError(
            f'env_ids {sorted(clash)} already have a step in flight in this batch '
            '(two concurrent calls for the same env)')
        continue
      seen.update(ids)
      accepted.append(i)
    if not accepted:
      return results
    if self.policy_error is not None:
      return self._refuse_all(results, accepted)

    batch = [requests[i] for i in accepted]
    def joined(field):  # one request's arrays as they are; several concatenated
      parts = [r.evaluating() if field == 'eval_mask' else getattr(r, field) for r in batch]
      return parts[0] if len(parts) == 1 else np.concatenate(parts)
    env_ids, run_ids, step_type, reward, discount, observation, eval_mask = (
        joined(f) for f in ('env_ids', 'run_ids', 'step_type', 'reward', 'discount',
                            'observation', 'eval_mask'))
    # A round: every training env once, in env-id order from here on (the replies'
    # actions go back in the requests' order below).
    order = None
    if self.rounds is not None and not eval_mask.any():
      order = np.argsort(env_ids, kind='stable')
      env_ids, run_ids, step_type, reward, discount, observation, eval_mask = (
          x[order] for x in (env_ids, run_ids, step_type, reward, discount, observation,
                             eval_mask))
      if not self._round_ready(env_ids):
        stop = self.rounds.stop
        why = stop.sentence() if hasattr(stop, 'sentence') else str(stop)
        return self._refuse_all(results, accepted,
                                f'the run ended before round {self.rounds.round}: {why}')
    restarted = self._note_restarts(env_ids, run_ids)

    try:
      out = self._policy.step(env_ids, observation, (step_type == FIRST) | restarted,
                              eval_mask)
    except InvalidActionError as e:
      logging.error('The policy produced actions no env may take; serving stops: %s', e)
      self.policy_error = self.policy_error or str(e)
      return self._refuse_all(results, accepted)
    action = out.action
    if order is not None:
      self.rounds.after_call()

    train = ~eval_mask
    if self._sink is not None and train.any():
      every = train.all()
      pick = (lambda x: x) if every else (lambda x: x[train])
      step = {'observation': pick(observation), 'reward': pick(reward),
              'discount': pick(discount), 'step_type': pick(step_type),
              'action': pick(action),
              'extras': {k: pick(v) for k, v in out.extras.items()},
              'state': tree.map_structure(pick, out.state)}
      self._sink.add(pick(env_ids), step)
    if self.acting is not None:
      self._count(env_ids, step_type, reward, eval_mask, self._episodes)

    if order is not None:
      action = action[np.argsort(order)]  # back in the order the requests came in
    offset = 0
    for i, r in zip(accepted, batch):
      results[i] = {'action': action[offset:offset + r.size]}
      offset += r.size
    return results

  def _serve_evaluation(self, r: protocol.Request) -> Dict[str, Any]:
    """A reproducible evaluator's call (module docstring): every evaluator env, served
    by the eval policy with its pass's weights; raises `InvalidRequestError` for a
    request that does not hold every evaluator env once."""
    evaluation, first = self._evaluation, self.rounds.num_envs
    order = np.argsort(r.env_ids, kind='stable')
    env_ids = r.env_ids[order]
    if not np.array_equal(env_ids, np.arange(first, first + evaluation.num_envs)):
      self.requests_refused += 1
      raise protocol.InvalidRequestError(
          f'an evaluation request for env_ids {sorted(set(r.env_ids.tolist()))[:16]}: a '
          f'reproducible run\'s evaluator sends all its envs {first}..'
          f'{first + evaluation.num_envs - 1} in each request')
    run_ids, step_type, reward = r.run_ids[order], r.step_type[order], r.reward[order]
    with self._eval_lock:
      if self.policy_error is not None:
        return {'shutting_down': f'the policy failed: {self.policy_error}'}
      changed = self._changed_run_ids(env_ids, run_ids)
      if changed.any():
        if (self._run_ids[env_ids[changed]] >= 0).any():
          self.actor_restarts += 1
          evaluation.not_exact('the evaluator restarted (its envs started over)')
          if self._eval_episodes is not None:
            self._eval_episodes.forget(env_ids[changed])
        self._run_ids[env_ids[changed]] = run_ids[changed]
      if self.on_eval_call is not None:  # a round checkpoint's evaluator part
        self.on_eval_call(evaluation.calls, env_ids)
      try:
        if not evaluation.begin_call(step_type, reward):
          return {'shutting_down': f'the run ended at round {evaluation.end_round}: no '
                  'evaluation pass starts after it'}
      except ShutdownError as e:
        return {'shutting_down': str(e)}
      evaluating = np.ones(len(env_ids), bool)
      try:
        out = self._eval_policy.step(env_ids, r.observation[order],
                                     (step_type == FIRST) | changed, evaluating)
      except InvalidActionError as e:
        logging.error('The policy produced actions no env may take; serving stops: %s', e)
        self.policy_error = self.policy_error or str(e)
        return {'shutting_down': f'the policy failed: {self.policy_error}'}
      evaluation.end_call()
      if self.acting is not None:
        self._count(env_ids, step_type, reward, evaluating, self._eval_episodes)
    return {'action': out.action[np.argsort(order)]}

  def _refuse_all(self, results: List[Any], accepted: Sequence[int],
                  why: str | None = None) -> List[Any]:
    why = why or f'the policy failed: {self.policy_error}'
    for i in accepted:
      results[i] = {'shutting_down': why}
    return results

  def _round_ready(self, env_ids: np.ndarray) -> bool:
    """A round gate's checks before its batch (env ids sorted): the batch is one call
    of every training env; a request held over from an earlier round (a retry) makes
    the run not exact; at a round's first call, the barrier and the round hook (False:
    the run ended there)."""
    gate = self.rounds
    if not np.array_equal(env_ids, np.arange(gate.num_envs)):
      raise RuntimeError(f'a round batch holds env ids {env_ids.tolist()[:32]}, not one '
                         f'call of each of 0..{gate.num_envs - 1}')
    held = self._batcher.held
    if held > self._held_seen:
      self._held_seen = held
      gate.not_exact(f'{held} request(s) for envs that already had one in the round '
                     '(a retried call, or a restarted actor\'s) waited for the next')
    return gate.before_call()

  def _changed_run_ids(self, env_ids: np.ndarray, run_ids: np.ndarray) -> np.ndarray:
    """Bool mask of the envs whose run id is not the one known; envs restored from a
    round checkpoint (`RESTORED`) take their actor's run id as it comes, unchanged."""
    changed = self._run_ids[env_ids] != run_ids
    adopted = changed & (self._run_ids[env_ids] == RESTORED)
    self._run_ids[env_ids[adopted]] = run_ids[adopted]
    return changed & ~adopted

  def _note_restarts(self, env_ids: np.ndarray, run_ids: np.ndarray) -> np.ndarray:
    """Bool mask of the envs whose run id changed (their actor restarted): their state
    starts over and their partial trajectories are dropped (with a round gate they are
    kept, so that rounds stay aligned, and the run is recorded as no longer exact).
    Envs restored from a round checkpoint take their actor's run id as it comes."""
    changed = self._changed_run_ids(env_ids, run_ids)
    if not changed.any():
      return changed
    restarted = env_ids[changed]
    known = restarted[self._run_ids[restarted] >= 0]
    if known.size:
      self.actor_restarts += 1
      logging.info('Run id changed for %d envs (actor restart): resetting their '
                   'state and dropping partial trajectories', known.size)
    self._run_ids[restarted] = run_ids[changed]
    if self._episodes is not None:
      self._episodes.forget(restarted)
    trained = known[known < self.rounds.num_envs] if self.rounds is not None else known
    if self.rounds is not None and trained.size:
      # Its envs start over mid-round: recorded, not hidden. Their unrolls go on (a
      # new episode inside one), so every round still has one unroll per env.
      self.rounds.not_exact(f'an actor restarted (envs {trained.min()}..{trained.max()})')
    elif self._sink is not None:
      self._sink.reset(restarted)
    return changed

  def _count(self, env_ids: np.ndarray, step_type: np.ndarray, reward: np.ndarray,
             eval_mask: np.ndarray, episodes: EpisodeTracker) -> None:
    """Served steps and the episodes they ended (`episodes`: the tracker of these
    envs), per `Mode`, into the acting account."""
    trained = int((~eval_mask).sum())
    self.acting.add_steps(Mode.TRAIN, trained)
    self.acting.add_steps(Mode.EVAL, len(env_ids) - trained)
    finished = episodes.observe(env_ids, step_type, reward)
    if len(finished.ids):
      # `observe` lists ended episodes in batch order: the LAST steps' order.
      ended_eval = eval_mask[step_type == LAST]
      for mode, pick in ((Mode.TRAIN, ~ended_eval), (Mode.EVAL, ended_eval)):
        self.acting.add_episodes(mode, Episodes(*(x[pick] for x in finished)))

  def round_state(self) -> Dict[str, Any]:
    """What serving the training envs goes on from, at a reproducible round's start
    (from the round hook: no batch in flight, the learner idle): the gate's call count,
    the policy's acting state (recurrent state, noise generator), the partial unrolls,
    the episodes in progress and the training counts. A part that cannot be saved is
    None there, named in `missing`."""
    gate = self.rounds
    ids = np.arange(gate.num_envs)
    state = {'calls': gate.calls, 'round': gate.schedule.round_of(gate.calls),
             'policy': self._policy.acting_state(ids),
             'sink': self._sink.state() if self._sink is not None else None,
             'episodes': self._episodes.state() if self._episodes is not None else None,
             'acting': self.acting.train_state() if self.acting is not None else None}
    state['missing'] = [k for k in ('policy', 'sink', 'episodes', 'acting')
                        if state[k] is None and not (k == 'sink' and self._sink is None)
                        and not (k in ('episodes', 'acting') and self.acting is None)]
    return state

  def restore_round_state(self, state: Dict[str, Any]) -> None:
    """Continues from `round_state()` (before serving starts): the gate at its round's
    first call, and every training env's state as it was; the envs take their actors'
    new run ids without starting over (`RESTORED`)."""
    gate = self.rounds
    ids = np.arange(gate.num_envs)
    if state['policy'] is not None:
      self._policy.load_acting_state(ids, state['policy'])
    if state['sink'] is not None and self._sink is not None:
      self._sink.load_state(state['sink'])
    if state['episodes'] is not None and self._episodes is not None:
      self._episodes.load_state(state['episodes'])
    if state['acting'] is not None and self.acting is not None:
      self.acting.load_train_state(state['acting'])
    gate.continue_at(state['round'])
    self._run_ids[ids] = RESTORED

  def mark_restored(self, env_ids: np.ndarray) -> None:
    """These envs were restored (the evaluator's, from a round checkpoint): they take
    their actor's new run id without starting over."""
    self._run_ids[np.asarray(env_ids, np.int64)] = RESTORED

  def restored_envs(self, env_ids: np.ndarray) -> np.ndarray:
    """Which of these envs were restored from a round checkpoint and have not been
    served since (their actor may restore its envs: `CentralNode.resume_envs`)."""
    return self._run_ids[np.asarray(env_ids, np.int64)] == RESTORED

  def state_of(self, env_ids) -> Any:
    """The stored recurrent state of these envs (the policy's device table; the
    reproducible evaluator's envs: its own policy's)."""
    if self._evaluation is not None and np.min(env_ids) >= self.rounds.num_envs:
      return self._eval_policy.state_of(env_ids)
    return self._policy.state_of(env_ids)

  def trajectory_stats(self) -> Dict[str, float]:
    """The trajectory sink's counters ({} when serving without recording)."""
    return self._sink.stats() if self._sink is not None else {}

  def pending_envs(self) -> int:
    """Envs whose requests wait for the next batch."""
    return self._batcher.pending()

  def batch_stats(self, reset: bool = False) -> batcher_lib.BatcherStats:
    return self._batcher.stats(reset)

  @property
  def batch_wait(self) -> Tuple[int, float]:
    """(envs, seconds): a batch runs once this many envs wait, or its first request
    waited this long (`max_batch_envs`, the batch timeout); with a round gate, nothing
    to wait for (the gate forms the batch)."""
    if self.rounds is not None:
      return self.rounds.num_envs, 0.0
    return self._batcher.max_batch_size, self._batch_timeout_s

  @property
  def max_batch_envs(self) -> int:
    """The policy runs once this many envs wait (or at the timeout)."""
    return self._batcher.max_batch_size

  @property
  def trajectory_sink(self):
    """Where served training steps go (None when serving without recording)."""
    return self._sink

  def stop_intake(self) -> None:
    """New requests get a `shutting_down` reply; the batch in flight may finish."""
    self._batcher.stop_intake()

  def close(self) -> None:
    self._batcher.close()

  def shutdown(self) -> None:
    """Refuses new requests, closes the sink (a batch blocked on a full table ends at
    once), then stops the batcher: no waiting out timeouts."""
    self.stop_intake()
    if self._sink is not None:
      self._sink.close()
    self.close()
