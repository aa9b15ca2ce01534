"""The reproducible evaluator (issue 63 Deliver 4, `seedacme.serving.evaluation`): each
evaluation pass is played by one named weights version, whatever the timing of the
evaluator's requests against training's rounds.

`EvalPasses` alone, with weights that are a number (the learner steps): a pass keeps
the copy of its round while training moves on, an evaluator ahead of training waits for
its round, training waits for an evaluator that lags too far, and the run's end names
the last pass; the server serves evaluation from the copy, beside a round that waits.
Then in process, a real central node with an evaluator thread: V-trace Catch on 2 x 8,
on 4 x 4 beside a busy loop and on 1 x 16 give the same pass records (versions, calls,
returns), rounds and weights.
"""

import json
import threading
import time

import numpy as np
import pytest

from seedacme.run.schedule import ClockClosedError, RoundSchedule
from seedacme.serving.evaluation import EvalPasses, episodes_per_env
from seedacme.types import FIRST, LAST, MID, Mode
from tests.unit.in_process import InProcessActor, run_to_its_end

T = 4  # unroll length: eval call c falls in round round_of(c): 0 for c <= 4, then c-1 // 4


class Weights:
  """The live weights are the learner's step count; the eval copy is what was loaded."""

  def __init__(self):
    self.live, self.loaded = 0, None

  def capture(self):
    return self.live

  def load(self, value):
    self.loaded = value


def _passes(weights, episodes=1, num_envs=2, max_lag_rounds=16, closed=lambda: False):
  records = []
  passes = EvalPasses(RoundSchedule(8, T, 8), num_envs, episodes, weights.capture,
                      weights.load, on_pass=records.append, is_closed=closed,
                      max_lag_rounds=max_lag_rounds)
  return passes, records


def _round(passes, weights, r):
  """Training starts round r (one learner step per round: S(r) = r)."""
  weights.live = r
  passes.round_started(r, r)


def _call(passes, *step_types, reward=(1.0, 1.0)):
  ok = passes.begin_call(np.array(step_types, np.int8), np.array(reward))
  if ok:
    passes.end_call()
  return ok


def test_episodes_per_env_covers_eval_episodes():
  assert episodes_per_env(20, 4) == 5 and episodes_per_env(5, 4) == 2
  assert episodes_per_env(1, 4) == 1
  with pytest.raises(ValueError):
    episodes_per_env(20, 0)


def test_a_pass_plays_its_rounds_copy_while_training_moves_on():
  w = Weights()
  passes, records = _passes(w)
  _round(passes, w, 0)
  assert _call(passes, FIRST, FIRST)  # call 0: pass 0 starts in round 0
  assert w.loaded == 0
  for r in (1, 2, 3):  # training runs three rounds ahead; the evaluator lags
    _round(passes, w, r)
  for _ in range(6):  # calls 1..6: the episodes go on, with the copy of round 0
    assert _call(passes, MID, MID)
  assert w.loaded == 0 and w.live == 3
  _call(passes, LAST, MID)  # call 7: env 0's episode ends (return 7)
  _call(passes, FIRST, LAST)  # call 8: env 1's (8); env 0 is done: uncounted now
  assert records == [
      {'pass': 0, 'round': 0, 'learner_steps': 0, 'first_call': 0, 'last_call': 8,
       'episodes': 2, 'average_return': 7.5, 'returns': [[7.0], [8.0]]}]
  # The next pass starts at the same call, 8, in round 1: round 1's copy, not the
  # live weights (round 3's).
  assert w.loaded == 1 and w.live == 3 and passes.playing['round'] == 1
  # Copies of rounds before the evaluator's next call's (9: round 2) are dropped.
  assert sorted(passes._copies) == [2, 3]


def test_an_evaluator_ahead_of_training_waits_for_its_round():
  w = Weights()
  passes, records = _passes(w)
  _round(passes, w, 0)
  _call(passes, FIRST, FIRST)
  for _ in range(4):  # calls 1..4: the rest of round 0
    _call(passes, MID, MID)
  # Call 5 ends pass 0 and starts pass 1, in round 1, which training has not started.
  thread = threading.Thread(target=_call, args=(passes, LAST, LAST))
  thread.start()
  thread.join(0.5)
  assert thread.is_alive() and w.loaded == 0  # round 1 has not started
  w.live = 99  # the learner steps on; the pass takes what round 1 starts with
  passes.round_started(1, 1)
  thread.join(5)
  assert not thread.is_alive() and w.loaded == 99 and passes.playing['learner_steps'] == 1
  assert passes.evaluator_wait_s > 0.3 and len(records) == 1


def test_training_waits_for_an_evaluator_that_lags_too_far():
  w = Weights()
  passes, _ = _passes(w, max_lag_rounds=2)
  for r in (0, 1, 2):
    _round(passes, w, r)
  thread = threading.Thread(target=_round, args=(passes, w, 3))
  thread.start()
  thread.join(0.5)
  assert thread.is_alive()  # round 3 would be 3 rounds ahead of the evaluator's round 0
  assert sorted(passes._copies) == [0, 1, 2]
  _call(passes, FIRST, FIRST)
  for _ in range(4):  # calls 1..4: round 0; the evaluator's next call (5) is in round 1
    _call(passes, MID, MID)
  thread.join(5)
  assert not thread.is_alive() and passes.training_wait_s > 0.3
  assert sorted(passes._copies) == [1, 2, 3]


def test_a_wait_ends_when_the_run_stops():
  w = Weights()
  closed = threading.Event()
  passes, _ = _passes(w, closed=closed.is_set)
  errors = []

  def call():
    try:
      _call(passes, FIRST, FIRST)
    except ClockClosedError as e:
      errors.append(e)
  thread = threading.Thread(target=call)
  thread.start()  # round 0 has not started
  time.sleep(0.2)
  closed.set()
  thread.join(5)
  assert not thread.is_alive() and len(errors) == 1


def test_the_runs_end_names_its_last_pass():
  w = Weights()
  passes, records = _passes(w)
  _round(passes, w, 0)
  _call(passes, FIRST, FIRST)
  _round(passes, w, 1)
  passes.run_ended(1, 1)  # the run ends at round 1's start: its weights are the last
  assert not passes.wait_finished(0.1)
  for _ in range(4):
    _call(passes, MID, MID)
  assert _call(passes, LAST, LAST)  # call 5 ends pass 0 and starts round 1's
  assert passes.playing['learner_steps'] == 1
  _call(passes, FIRST, FIRST)
  for _ in range(2):
    _call(passes, MID, MID)
  # Call 9 ends pass 1; the next would start in round 2, after the run's end, and
  # the final weights (round 1's) have had their pass.
  assert not _call(passes, LAST, LAST)
  assert passes.wait_finished(1.0) and passes.summary()['eval_complete']
  assert [r['learner_steps'] for r in records] == [0, 1]


def test_the_final_weights_get_a_pass_when_none_started_in_the_last_round():
  w = Weights()
  passes, records = _passes(w)
  _round(passes, w, 0)
  _call(passes, FIRST, FIRST)
  for r in (1, 2):
    _round(passes, w, r)
  passes.run_ended(2, 2)
  _call(passes, LAST, LAST)  # call 1 ends pass 0, starts pass 1 in round 0
  _call(passes, FIRST, FIRST)
  for _ in range(7):  # calls 3..9
    _call(passes, MID, MID)
  # Call 10 (round 2) ends pass 1, starts pass 2 with round 2's weights; the copy of
  # round 2 outlives the evaluator's passing it.
  assert _call(passes, LAST, LAST) and passes.playing['round'] == 2
  _call(passes, FIRST, FIRST)
  for _ in range(4):  # calls 12..15: the evaluator is in round 3 now
    _call(passes, MID, MID)
  # Call 16: pass 2 ends; no pass started in round 3 exists, but the final weights
  # (round 2) have had theirs: the evaluator is done.
  assert not _call(passes, LAST, LAST)
  assert [r['learner_steps'] for r in records] == [0, 0, 2]
  w2 = Weights()
  passes, records = _passes(w2)
  _round(passes, w2, 0)
  _call(passes, FIRST, FIRST)
  _round(passes, w2, 1)
  passes.run_ended(1, 1)
  for _ in range(8):  # calls 1..8: the pass of round 0 runs past round 1's calls
    _call(passes, MID, MID)
  # Call 9 (round 2): no round 2; the final weights (round 1) get the last pass.
  assert _call(passes, LAST, LAST) and passes.playing['round'] == 1
  _call(passes, FIRST, FIRST)
  assert not _call(passes, LAST, LAST)
  assert [r['learner_steps'] for r in records] == [0, 1]


# ---- in process: a real central node with an evaluator --------------------------------
STEPS = 12  # learner steps (one per round: 16 unrolls of Catch per learner batch)




def _run(make_central, tmp_path, num_actors, envs_per_actor, busy=0, lag=0):
  """One reproducible V-trace Catch run with a 4-env evaluator: (pass records, round
  records, summary)."""
  from seedacme.agents import registry, vtrace  # pylint: disable=g-import-not-at-top
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  logdir = tmp_path / f'{num_actors}x{envs_per_actor}-busy{busy}-lag{lag}'
  builder = vtrace.VTraceBuilder(registry.make_config('vtrace', 'catch', batch_size=16,
                                                      unroll_length=10, seed=3))
  central, _, actors, _ = make_central(
      builder, 'catch', num_actors, envs_per_actor, reproducible=True,
      reproducible_lag=lag, max_learner_steps=STEPS, checkpoint_interval_s=None, export_policy=False,
      logdir=str(logdir), progress_interval_s=1.0, seed=3, num_eval_envs=4,
      eval_episodes=8)
  evaluator = InProcessActor(central, envs.make_factory('catch'), 16, 4, actors[0].stop, Mode.EVAL)
  rounds = run_to_its_end(central, actors + [evaluator], logdir, busy)
  with open(logdir / 'evals.jsonl') as f:
    passes = [json.loads(line) for line in f]
  return passes, rounds, central.summary


@pytest.mark.timeout(240)
def test_the_evaluators_passes_are_the_same_on_any_split_and_under_load(make_central,
                                                                        tmp_path):
  first, rounds, summary = _run(make_central, tmp_path, 2, 8)
  assert summary['stop']['kind'] == 'learner_steps'
  assert summary['exact_until_round'] is None and summary['eval_exact_until_pass'] is None
  assert summary['eval_complete'] and summary['eval_passes'] == len(first) >= 3
  assert summary['eval_episodes_per_env'] == 2
  # Passes are played in order by versions of the run's rounds, the last round's
  # (the final weights) included; each pass is 4 envs x 2 episodes.
  versions = [p['learner_steps'] for p in first]
  assert versions == sorted(versions) and len(set(versions)) >= 3
  assert versions[-1] == STEPS == rounds[-1]['learner_steps']
  assert all(p['episodes'] == 8 and len(p['returns']) == 4 for p in first)
  assert [p['pass'] for p in first] == list(range(len(first)))
  for num_actors, envs_per_actor, busy in ((4, 4, 1), (1, 16, 0)):
    other, other_rounds, other_summary = _run(make_central, tmp_path, num_actors,
                                              envs_per_actor, busy)
    assert other == first, (num_actors, envs_per_actor, busy)
    assert other_rounds == rounds
    assert other_summary['weights_sha256'] == summary['weights_sha256']


@pytest.mark.timeout(240)
def test_with_lag_1_the_passes_play_the_rounds_copies_on_any_split(make_central, tmp_path):
  # Inference's copy is set at each round's start while the learner trains on: the
  # evaluator's copies are the rounds' weights (S(r) = r - 1 steps), not the learner's.
  first, rounds, summary = _run(make_central, tmp_path, 2, 8, lag=1)
  assert summary['exact_until_round'] is None and summary['eval_exact_until_pass'] is None
  assert summary['eval_complete'] and len(first) >= 3
  acted = {r['round']: r['learner_steps'] for r in rounds}
  assert all(p['learner_steps'] == acted[p['round']] for p in first)
  assert first[-1]['learner_steps'] == STEPS == rounds[-1]['learner_steps']
  other, other_rounds, other_summary = _run(make_central, tmp_path, 4, 4, lag=1)
  assert other == first and other_rounds == rounds
  assert other_summary['weights_sha256'] == summary['weights_sha256']


# ---- the server: evaluation requests served by the eval copy, outside the batcher -----
class _NumberPolicy:
  """A policy whose every action is its weights, a number (`weights()`)."""

  def __init__(self, num_envs, weights):
    self.num_envs, self.weights, self.batches = num_envs, weights, []

  def step(self, env_ids, observation, reset, eval_mask):
    from seedacme.serving.policy import PolicyStep  # pylint: disable=g-import-not-at-top
    self.batches.append(env_ids.tolist())
    return PolicyStep(np.full(len(env_ids), self.weights(), np.int32), {}, ())

  def state_of(self, env_ids):
    return ()


def test_the_server_serves_evaluation_from_the_copy_of_its_passes_round():
  from seedacme.run.accounting import ActingLog  # pylint: disable=g-import-not-at-top
  from seedacme.run.schedule import RoundClock  # pylint: disable=g-import-not-at-top
  from seedacme.serving.rounds import RoundGate  # pylint: disable=g-import-not-at-top
  from seedacme.serving.server import InferenceServer  # pylint: disable=g-import-not-at-top
  from seedacme.types import EnvSpec  # pylint: disable=g-import-not-at-top
  from seedacme.wire.protocol import make_request  # pylint: disable=g-import-not-at-top
  spec = EnvSpec(observation_shape=(2,), observation_dtype='float32', num_actions=64)
  live, copy = {'w': 0}, {'w': None}
  clock = RoundClock()
  schedule = RoundSchedule(4, 2, 2)  # 4 training envs, T = 2, 2 learner steps a round
  gate = RoundGate(schedule, clock)
  train = _NumberPolicy(6, lambda: live['w'])
  server = InferenceServer(train, spec, 6, acting=ActingLog(), rounds=gate)
  evaluation = EvalPasses(schedule, 2, 1, lambda: live['w'],
                          lambda w: copy.__setitem__('w', w))
  server.evaluate_with(evaluation, _NumberPolicy(6, lambda: copy['w']))

  def call(ids, step_type, mode):
    k = len(ids)
    request = make_request(ids, np.ones(k), np.zeros((k, 2), np.float32), np.zeros(k),
                           np.ones(k), np.full(k, step_type), mode)
    thread = threading.Thread(target=lambda: setattr(thread, 'reply', server.step(request)),
                              daemon=True)
    thread.start()
    return thread

  def served(thread):
    thread.join(10)
    assert not thread.is_alive()
    return thread.reply['action'].tolist()

  def train_call(step_type=MID):
    return served(call([0, 1, 2, 3], step_type, Mode.TRAIN))

  def eval_call(step_type):
    return served(call([5, 4], step_type, Mode.EVAL))

  try:
    assert train_call(FIRST) == [0] * 4  # call 0: round 0 starts (a copy of weights 0)
    assert eval_call(FIRST) == [0, 0]  # the evaluator's call 0: pass 0, round 0
    train_call()
    train_call()
    live['w'] = 2  # the learner's two steps after round 0
    clock.note_learner_steps(2)
    assert train_call() == [2] * 4  # call 3: round 1 (a copy of weights 2)
    live['w'] = 3  # a change the pass's copy must not see
    assert eval_call(MID) == [0, 0]  # pass 0 plays round 0's weights to its end
    train_call()  # call 4; call 5 starts round 2, which waits for learner step 4
    waiting = call([0, 1, 2, 3], MID, Mode.TRAIN)
    time.sleep(0.3)
    assert waiting.is_alive()  # the round waits at the barrier, the batcher busy ...
    assert eval_call(MID) == [0, 0]  # ... and the evaluator is served meanwhile
    # Call 3 ends pass 0 and starts pass 1 in round 1: round 1's copy, not the live 3.
    assert eval_call(LAST) == [2, 2]
    assert evaluation.records[0]['learner_steps'] == 0
    assert evaluation.playing == {'pass': 1, 'round': 1, 'learner_steps': 2,
                                  'first_call': 3}
    # Evaluation rows never reached the training policy.
    assert all(max(b) < 4 for b in train.batches)
    clock.note_learner_steps(4)
    assert served(waiting) == [3] * 4
  finally:
    server.shutdown()
