"""The reproducible evaluator: greedy passes, each played by one named weights version
(issue 63, Deliver 4).

Without it the evaluator's greedy actions come from whatever weights are current when
its request arrives, so its returns depend on timing even when training does not. In a
reproducible run (`ProgramConfig.reproducible`) the evaluator plays in passes instead:

* Pass k: each of the K evaluator envs plays E episodes (E = ceil(eval_episodes / K)),
  counted from each env's first episode start (FIRST step) in the pass; an env that has
  played its E goes on stepping uncounted until the pass ends (the evaluator steps its K
  envs together, so those steps are as many in every run).
* Its version: the pass that starts at the evaluator's call c plays the weights at the
  start of training round `round_of(c)` (`seedacme.run.schedule`: the evaluator's calls
  are counted as a training env's are), i.e. after learner step S(round_of(c)). Every
  episode of the pass, start to end, is played by that version. Which version plays is a
  function of the evaluator's call count, which its own episodes decide: of the seed.
* Where the weights come from: a second copy of the policy (the central node's eval
  policy: its own variables, its own per-env state table for the evaluator's envs). At
  a round's start, when the round gate has waited for the learner (the weights are the
  round's: with lag 0 the learner waits for the round's data, with a lag inference's
  copy is set only at round starts), `round_started` keeps a copy
  of them (`capture`) if the evaluator may still start a pass in that round; at a pass
  start the evaluator's request loads its round's copy into the eval policy (`load`).
  Training batches never see the eval copy, evaluation batches never see the live one.
* The evaluator ahead of training (its pass starts in a round not yet started): its
  request waits, on its own thread, for that round. It is served outside the batcher
  (`InferenceServer`), so it holds up no training batch.
* The evaluator behind training: the copies of the rounds it may still need are kept,
  and training goes on, up to `max_lag_rounds` rounds ahead of the evaluator's next
  call; further, a round's start waits for the evaluator (`training_wait_s`, in the
  summary). Why wait rather than skip: a version skipped because the evaluator was slow
  would be decided by timing; a bound keeps memory at `max_lag_rounds` copies of the
  policy. The evaluator makes about as many calls per second as an actor (fewer envs,
  no learner to wait for), so the bound is reached only when it is starved or gone.
* The run's end: the round gate ends the run at a round's start (a step budget or the
  training target); `run_ended` names that round, whose weights are the final ones.
  Passes that start in it or before are played to their end; the first that would
  start after it plays the final weights instead (unless the pass before it did), and
  is the last (`CentralNode` waits for them, boundedly: `wait_finished`). So the run's
  pass records are the same list in every run of the seed, and end with the final
  weights' pass.

Records (`on_pass`, written to `<logdir>/evals.jsonl` by the run monitor): pass, round,
learner_steps (the version), first and last call, the returns per env in the order its
episodes ended, their average. What cannot be replayed exactly (the evaluator restarted,
so its envs start over) is recorded as `exact_until_pass`, not hidden.

A run without `--reproducible` is unchanged: its evaluation requests share the batcher
and act with the weights current when they are served. A reproducible run refuses an
evaluator on a clock (`eval_interval_s`: it would idle while training waits for it) and
a half-batch engine for its envs (a call holds every evaluator env).

Numpy and the standard library only: the server imports it; the central node gives the
TensorFlow side (`capture`, `load`).
"""

import math
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

from absl import logging
import numpy as np

from seedacme.run.schedule import ClockClosedError, RoundSchedule
from seedacme.types import FIRST, LAST

# Rounds training may run ahead of the evaluator's next call before a round's start
# waits for it: as many copies of the policy are kept at most (module docstring).
MAX_LAG_ROUNDS = 16


def episodes_per_env(eval_episodes: int, num_eval_envs: int) -> int:
  """E: episodes each evaluator env plays per pass (at least `eval_episodes` in all)."""
  if num_eval_envs < 1 or eval_episodes < 1:
    raise ValueError(f'a pass needs evaluator envs and episodes, got {num_eval_envs} envs '
                     f'and eval_episodes={eval_episodes}')
  return math.ceil(eval_episodes / num_eval_envs)


class EvalPasses:
  """Which weights each evaluation pass plays, their copies, and the pass records."""

  POLL_S = 0.05  # how often a wait checks `is_closed`

  def __init__(self, schedule: RoundSchedule, num_envs: int, episodes: int,
               capture: Callable[[], Any], load: Callable[[Any], None],
               on_pass: Callable[[Dict[str, Any]], None] | None = None,
               is_closed: Callable[[], bool] = lambda: False,
               max_lag_rounds: int = MAX_LAG_ROUNDS):
    """`schedule`: the training rounds; `num_envs`: K evaluator envs; `episodes`: E per
    env per pass; `capture()`: a copy of the live weights (at a round's start);
    `load(copy)`: makes the eval policy act with it; `on_pass(record)`: each finished
    pass; `is_closed`: the run is stopping (ends every wait)."""
    if max_lag_rounds < 0:
      raise ValueError(f'max_lag_rounds must be >= 0, got {max_lag_rounds}')
    self.schedule = schedule
    self.num_envs, self.episodes = int(num_envs), int(episodes)
    self._capture, self._load, self._on_pass = capture, load, on_pass
    self._is_closed = is_closed
    self.max_lag_rounds = int(max_lag_rounds)
    self._cond = threading.Condition()
    self._copies: Dict[int, Tuple[int, Any]] = {}  # round -> (learner steps, weights)
    self.started_round = -1  # the last round training started
    self.end_round: int | None = None  # the run ended at this round's start
    self.finished = False  # no pass will start any more (the run ended before it)
    self.calls = 0  # evaluator calls served (each: all K envs)
    self.playing: Dict[str, Any] | None = None  # the pass being played
    self._loaded: Any = None  # its weights (the copy `load` was given)
    self.records: List[Dict[str, Any]] = []
    self._done = np.zeros(self.num_envs, np.int64)  # episodes counted this pass
    self._counting = np.zeros(self.num_envs, bool)  # in a counted episode
    self._return = np.zeros(self.num_envs, np.float64)
    self._returns: List[List[float]] = []
    self.training_wait_s = 0.0  # rounds' starts waiting for a lagging evaluator
    self.evaluator_wait_s = 0.0  # pass starts waiting for their round
    self.copies_taken = 0
    self.exact_until_pass: int | None = None  # None: every pass exact so far
    self.not_exact_because: str | None = None

  # ---- training's side: the round gate's leader thread -----------------------------
  def _evaluator_round(self) -> int:
    """The round of the evaluator's next call: no pass can start in an earlier one."""
    return self.schedule.round_of(self.calls)

  def _wait(self, done: Callable[[], bool], what: str) -> float:
    """With the lock held: waits until `done()`; the seconds waited. Raises
    `ClockClosedError` once the run is stopping."""
    started = time.monotonic()
    while not done():
      if self._is_closed():
        raise ClockClosedError(f'stopped waiting for {what}: the run is stopping')
      self._cond.wait(self.POLL_S)
    return time.monotonic() - started

  def round_started(self, round_index: int, learner_steps: int) -> None:
    """Round `round_index` starts, acting with the weights after `learner_steps`
    steps: keeps a copy if the evaluator may start a pass in it (first waiting, if it
    lags by more than `max_lag_rounds`)."""
    with self._cond:
      self.training_wait_s += self._wait(
          lambda: round_index - self._evaluator_round() <= self.max_lag_rounds,
          f'the evaluator (round {round_index} would run more than '
          f'{self.max_lag_rounds} rounds ahead of it)')
      self.started_round = round_index
      if round_index >= self._evaluator_round():
        self._copies[round_index] = (int(learner_steps), self._capture())
        self.copies_taken += 1
      self._cond.notify_all()

  def run_ended(self, round_index: int, learner_steps: int) -> None:
    """The run ended at round `round_index`'s start, with the weights after
    `learner_steps` steps (the final weights: no later round's exist). Keeps their copy
    for the last pass."""
    with self._cond:
      self.end_round = round_index
      if round_index not in self._copies:
        self._copies[round_index] = (int(learner_steps), self._capture())
        self.copies_taken += 1
      self._cond.notify_all()

  # ---- the evaluator's side: one call at a time -------------------------------------
  def begin_call(self, step_type: np.ndarray, reward: np.ndarray) -> bool:
    """Before the evaluator's call `calls` (its K envs in env-id order): counts the
    episodes these steps end; at a pass start, waits for the pass's round and loads
    its weights. False: the run ended before that round (no pass any more). Raises
    `ClockClosedError` if the run stops while it waits."""
    step_type = np.asarray(step_type)
    reward = np.asarray(reward, np.float64)
    counting = self._counting
    self._return[counting & (step_type != FIRST)] += reward[counting & (step_type != FIRST)]
    ended = counting & (step_type == LAST)
    for j in np.flatnonzero(ended):
      self._returns[j].append(float(self._return[j]))
    self._done[ended] += 1
    counting[ended] = False
    if self.playing is not None and (self._done >= self.episodes).all():
      self._end_pass()
    if self.playing is None and not self._start_pass():
      return False
    # Counted episodes start at a FIRST step (a FIRST mid-episode: the evaluator
    # restarted; the episode starts over, and the pass is not exact).
    start = (step_type == FIRST) & (self._done < self.episodes)
    counting[start] = True
    self._return[start] = 0.0
    return True

  def end_call(self) -> None:
    """The call was served: the evaluator's next call is the next one; copies of rounds
    before its round can no longer be needed."""
    with self._cond:
      self.calls += 1
      first_needed = self._evaluator_round()
      for r in [r for r in self._copies if r < first_needed and r != self.end_round]:
        del self._copies[r]
      self._cond.notify_all()

  def _start_pass(self) -> bool:
    round_index = self._evaluator_round()
    with self._cond:
      self.evaluator_wait_s += self._wait(
          lambda: round_index in self._copies or (
              self.end_round is not None and round_index > self.end_round),
          f'training round {round_index} (an evaluation pass starts in it)')
      if round_index not in self._copies:  # after the run's last round
        if self.records and self.records[-1]['round'] == self.end_round:
          self.finished = True  # the final weights have had their pass
          self._cond.notify_all()
          return False
        round_index = self.end_round  # the last pass: the final weights
      learner_steps, weights = self._copies[round_index]
    self._load(weights)
    self._loaded = weights
    self.playing = {'pass': len(self.records), 'round': round_index,
                    'learner_steps': learner_steps, 'first_call': self.calls}
    self._done[:] = 0
    self._counting[:] = False
    self._returns = [[] for _ in range(self.num_envs)]
    return True

  def _end_pass(self) -> None:
    returns = [r[:self.episodes] for r in self._returns]
    flat = [x for r in returns for x in r]
    record = dict(self.playing, last_call=self.calls, episodes=len(flat),
                  average_return=float(np.mean(flat)), returns=returns)
    self.playing = None
    with self._cond:
      self.records.append(record)
      self._cond.notify_all()
    if self._on_pass is not None:
      self._on_pass(record)

  # ---- round checkpoints (`seedacme.run.resume`) --------------------------------------
  def state(self) -> Dict[str, Any]:
    """What the passes go on from, between the evaluator's calls: its call count, the
    pass being played with its weights, the episodes it counted so far, the records.
    The copies of later rounds are not in it: a resume at round r takes them again at
    the rounds' starts (the evaluator's next pass starts in round r or later)."""
    with self._cond:
      return {'calls': self.calls, 'playing': None if self.playing is None else
              dict(self.playing), 'weights': self._loaded if self.playing else None,
              'done': self._done.copy(), 'counting': self._counting.copy(),
              'return': self._return.copy(), 'returns': [list(r) for r in self._returns],
              'records': [dict(r) for r in self.records]}

  def load_state(self, state: Dict[str, Any]) -> None:
    """Continues from `state()` (before the evaluator's first call), its weights loaded."""
    if state['weights'] is not None:
      self._load(state['weights'])
    with self._cond:
      self.calls = int(state['calls'])
      self.playing = None if state['playing'] is None else dict(state['playing'])
      self._loaded = state['weights']
      self._done = np.array(state['done'], np.int64)
      self._counting = np.array(state['counting'], bool)
      self._return = np.array(state['return'], np.float64)
      self._returns = [list(r) for r in state['returns']]
      self.records = [dict(r) for r in state['records']]
      self._cond.notify_all()

  def not_exact(self, why: str) -> None:
    """From the pass being played on (or the next), the records may differ from the
    ones the seed names; the first such event is kept, and logged."""
    with self._cond:
      if self.exact_until_pass is not None:
        return
      self.exact_until_pass = len(self.records)
      self.not_exact_because = why
    logging.warning('Reproducible evaluator: not exact from pass %d on: %s',
                    self.exact_until_pass, why)

  def wait_finished(self, timeout_s: float, stop: Callable[[], bool] = lambda: False) -> bool:
    """After `run_ended`: waits until every pass that starts by the last round has been
    played (the evaluator asked for a later one), `stop()` or `timeout_s`; whether it
    finished."""
    deadline = time.monotonic() + timeout_s
    with self._cond:
      while not self.finished and not stop() and not self._is_closed():
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cond.wait(min(self.POLL_S, left))
      return self.finished

  def summary(self) -> Dict[str, Any]:
    """What the run's summary says of the evaluator's passes."""
    with self._cond:
      last = self.records[-1] if self.records else None
      return {'eval_passes': len(self.records),
              'eval_episodes_per_env': self.episodes,
              'eval_last_pass': None if last is None else {
                  k: last[k] for k in ('pass', 'round', 'learner_steps', 'episodes',
                                       'average_return')},
              'eval_complete': self.finished,
              'eval_exact_until_pass': self.exact_until_pass,
              'eval_not_exact_because': self.not_exact_because,
              'eval_training_wait_s': self.training_wait_s,
              'eval_copies_taken': self.copies_taken}
