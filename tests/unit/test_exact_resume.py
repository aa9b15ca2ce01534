"""A reproducible run killed after a round checkpoint and resumed is the uninterrupted
run from that checkpoint on (issue 63 Deliver 3, `seedacme.run.resume`).

In process (`make_central`): run A goes to `STEPS` learner steps without a stop; run
B, same seed and config with a round checkpoint every `EVERY` rounds, is stopped in
the middle of a later round (its stop event, as a signal would: no checkpoint is
written at the stop), then a new central node, a new Reverb server and new actors
(for V-trace on another split, 4 x 4) resume from B's logdir and go on to `STEPS`. B's
rounds.jsonl and final weights hash must be A's. And an env that cannot be pickled, or
an actor that starts its envs anew: the resume says from which round it is no longer
exact.
"""

import functools
import json
import pickle
import re
import threading
import time

import pytest

from seedacme import envs
from seedacme.agents import ppo, registry, vtrace
from seedacme.types import Mode
from seedacme.wire.protocol import InvalidRequestError
from tests.unit.in_process import InProcessActor

STEPS = 20  # learner steps: one per round for V-trace Catch (16 envs, batch 16)
EVERY = 5  # checkpoint_rounds of run B


def _vtrace_catch():
  return vtrace.VTraceBuilder(registry.make_config('vtrace', 'catch', batch_size=16,
                                                   unroll_length=10, seed=3))


def _ppo_cartpole():
  return ppo.PPOBuilder(registry.make_config('ppo', 'cartpole', unroll_length=16, seed=3))


def _rounds(logdir):
  with open(logdir / 'rounds.jsonl') as f:
    return [json.loads(line) for line in f]


def _start(make_central, builder, env, logdir, actor=InProcessActor, steps=STEPS, split=(2, 8),
           checkpoints=True, lag=0, evaluator=False, eval_snapshots=True):
  """`evaluator`: with a 4-env evaluator (8 episodes a pass) handing in its envs too
  (`eval_snapshots`=False: one that never asks for them back)."""
  snapshots = (builder.config.unroll_length, EVERY)
  central, _, actors, _ = make_central(
      builder, env, *split, reproducible=True, reproducible_lag=lag, max_learner_steps=steps,
      checkpoint_interval_s=3600.0 if checkpoints else None, checkpoint_rounds=EVERY,
      export_policy=False, logdir=str(logdir), progress_interval_s=1.0, seed=3,
      actor=functools.partial(actor, snapshots=snapshots),
      **({'num_eval_envs': 4, 'eval_episodes': 8} if evaluator else {}))
  if evaluator:
    actors.append(InProcessActor(central, envs.make_factory(env), 16, 4, actors[0].stop,
                                 Mode.EVAL, snapshots=snapshots if eval_snapshots else None))
  for a in actors:
    a.start()
  return central, actors


def _run_to_end(make_central, builder_fn, env, logdir, **kwargs):
  """A run (or a resume) to `STEPS`: (round records, summary, resumed round)."""
  central, actors = _start(make_central, builder_fn(), env, logdir, **kwargs)
  central.run()
  assert all(a.error is None for a in actors), [a.error for a in actors]
  return _rounds(logdir), central.summary, central.resumed_round


def _killed_after_round(make_central, builder_fn, env, logdir, after_round, **kwargs):
  """Run B, stopped by its stop event once round `after_round` has started."""
  central, actors = _start(make_central, builder_fn(), env, logdir, **kwargs)
  deadline = time.monotonic() + 120
  stopper = actors[0].stop

  def watch():
    while central.rounds.round < after_round and time.monotonic() < deadline:
      time.sleep(0.01)
    stopper.set()
  threading.Thread(target=watch, daemon=True).start()
  central.run()
  assert central.rounds.round >= after_round
  return central.summary


def _check_resume(make_central, tmp_path, builder_fn, env, resume_split=(2, 8), lag=0):
  """A uninterrupted; B stopped two rounds after its checkpoint at round 2 * EVERY,
  then resumed on `resume_split` actors x envs: B's records and weights are A's."""
  whole, summary_a, _ = _run_to_end(make_central, builder_fn, env, tmp_path / 'a',
                                    checkpoints=False, lag=lag)
  assert summary_a['exact_until_round'] is None, summary_a['not_exact_because']
  assert [r['round'] for r in whole] == list(range(STEPS + 1 + lag))
  b = tmp_path / 'b'
  killed = _killed_after_round(make_central, builder_fn, env, b, 2 * EVERY + 2, lag=lag)
  assert killed['stop']['kind'] == 'stop_requested', killed['stopped_because']
  written = _rounds(b)
  assert written[-1]['round'] >= 2 * EVERY + 2  # records past the checkpoint
  with open(b / 'checkpoints' / 'rounds' / f'round-{2 * EVERY}.pkl', 'rb') as f:
    saved = pickle.load(f)
  assert sorted(saved['envs']) == list(range(16)) and saved['envs_missing'] is None
  # With a lag L, the L rounds of unrolls the learner had yet to take, in env-id order.
  recent = saved['server']['sink'].get('recent') or []
  assert [int(e) for g in recent for e in g['extras']['env_id'][:, 0]] == list(range(16)) * lag
  assert written == whole[:len(written)]
  resumed, summary_b, at = _run_to_end(make_central, builder_fn, env, b,
                                       split=resume_split, lag=lag)
  assert at == 2 * EVERY  # the last round checkpoint before the stop
  assert summary_b['exact_until_round'] is None, summary_b['not_exact_because']
  assert summary_b['stop']['kind'] == 'learner_steps', summary_b['stopped_because']
  assert resumed == whole
  assert summary_b['weights_sha256'] == summary_a['weights_sha256']
  return summary_b


@pytest.mark.timeout(240)
def test_vtrace_catch_resumed_at_a_round_checkpoint_is_the_uninterrupted_run(
    make_central, tmp_path):
  # Resumed on 4 x 4: the envs are saved by global env id, not by actor.
  _check_resume(make_central, tmp_path, _vtrace_catch, 'catch', resume_split=(4, 4))


@pytest.mark.timeout(240)
def test_ppo_cartpole_resumed_at_a_round_checkpoint_is_the_uninterrupted_run(
    make_central, tmp_path):
  _check_resume(make_central, tmp_path, _ppo_cartpole, 'cartpole')


@pytest.mark.timeout(300)
@pytest.mark.parametrize('builder_fn, env, lag, resume_split', [
    (_vtrace_catch, 'catch', 2, (4, 4)), (_ppo_cartpole, 'cartpole', 1, (2, 8))])
def test_a_lagged_run_resumed_at_a_round_checkpoint_is_the_uninterrupted_run(
    make_central, tmp_path, builder_fn, env, lag, resume_split):
  # At a round's start the learner has yet to take the L rounds before it: the round
  # state holds their L x 16 unrolls and the resume writes them to the queue again.
  _check_resume(make_central, tmp_path, builder_fn, env, resume_split=resume_split,
                lag=lag)


@pytest.mark.timeout(240)
def test_a_run_ended_off_a_checkpoint_round_extends_exactly_from_the_round_before(
    make_central, tmp_path):
  """A budget met at round 13 saves its last checkpoint without the envs (the actors
  snapshot only at checkpoint rounds); the same run with a larger budget resumes from
  round 10's and is the uninterrupted run."""
  whole, summary_a, _ = _run_to_end(make_central, _vtrace_catch, 'catch', tmp_path / 'a',
                                    checkpoints=False)
  b = tmp_path / 'b'
  first, summary_first, _ = _run_to_end(make_central, _vtrace_catch, 'catch', b, steps=13)
  assert summary_first['stop']['kind'] == 'learner_steps' and first == whole[:14]
  resumed, summary_b, at = _run_to_end(make_central, _vtrace_catch, 'catch', b)
  assert at == 2 * EVERY
  assert summary_b['exact_until_round'] is None, summary_b['not_exact_because']
  assert resumed == whole
  assert summary_b['weights_sha256'] == summary_a['weights_sha256']
  with open(b / 'progress.jsonl') as f:
    assert 'the newest this run continues exactly from, not the latest' in f.read()


def _evals(logdir):
  with open(logdir / 'evals.jsonl') as f:
    return [json.loads(line) for line in f]


@pytest.mark.timeout(240)
def test_the_evaluator_resumes_exactly_with_the_run(make_central, tmp_path):
  """Its passes after the resume are the uninterrupted run's: the evaluator's state and
  envs at its own call of round 10's first call number were saved beside the round
  checkpoint and it continues from them."""
  whole, summary_a, _ = _run_to_end(make_central, _vtrace_catch, 'catch', tmp_path / 'a',
                                    checkpoints=False, evaluator=True)
  passes = _evals(tmp_path / 'a')
  assert summary_a['eval_exact_until_pass'] is None and summary_a['eval_complete']
  b = tmp_path / 'b'
  _killed_after_round(make_central, _vtrace_catch, 'catch', b, 2 * EVERY + 2, evaluator=True)
  assert (b / 'checkpoints' / 'rounds' / f'eval-{2 * EVERY}.pkl').exists()
  resumed, summary_b, at = _run_to_end(make_central, _vtrace_catch, 'catch', b,
                                       evaluator=True)
  assert at == 2 * EVERY and resumed == whole
  assert summary_b['eval_exact_until_pass'] is None, summary_b['eval_not_exact_because']
  assert summary_b['eval_complete'] and _evals(b) == passes
  assert summary_b['weights_sha256'] == summary_a['weights_sha256']
  # An evaluator that starts its envs anew on the resume: said, not hidden.
  c = tmp_path / 'c'
  _killed_after_round(make_central, _vtrace_catch, 'catch', c, 2 * EVERY + 2, evaluator=True)
  assert (c / 'checkpoints' / 'rounds' / f'eval-{2 * EVERY}.pkl').exists()
  _, summary_c, _ = _run_to_end(make_central, _vtrace_catch, 'catch', c, evaluator=True,
                                eval_snapshots=False)
  assert summary_c['exact_until_round'] is None, summary_c['not_exact_because']
  assert 'did not come back' in (summary_c['eval_not_exact_because'] or ''), summary_c


@pytest.mark.timeout(120)
def test_a_crafted_evaluator_snapshot_is_refused_by_name(make_central, tmp_path):
  """env_snapshot for the evaluator's envs takes all of them, each as bytes: objects
  or a part are refused before anything is kept (the evaluator unpickles what a resume
  hands it)."""
  central, actors = _start(make_central, _vtrace_catch(), 'catch', tmp_path, evaluator=True)
  actors[0].stop.set()
  for ids, blobs in (([16, 17, 18, 19], [b'a', b'b', {'x': 1}, b'd']),
                     ([16, 17], [b'a', b'b']), ([16, 16, 18, 19], [b'a'] * 4)):
    with pytest.raises(InvalidRequestError, match="the evaluator's envs are 16..19"):
      central.env_snapshot(EVERY, ids, blobs)
  assert not central._eval_parts  # pylint: disable=protected-access


class UnpicklableActor(InProcessActor):
  """An actor whose first env holds a lock: it does not pickle."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.envs._envs[0].lock = threading.Lock()  # pylint: disable=protected-access


class ForgetfulActor(InProcessActor):
  """An actor that starts its envs anew on a resume (it never asks for them)."""

  def __init__(self, *args, snapshots=None, **kwargs):
    del snapshots
    super().__init__(*args, **kwargs)


@pytest.mark.timeout(240)
@pytest.mark.parametrize('first, then, why', [
    (UnpicklableActor, InProcessActor, r'envs (0\.\.7|8\.\.15): env 0 \(Catch\) cannot be pickled'),
    (InProcessActor, ForgetfulActor, r'envs \[0, 1, .*\] did not come back to it')])
def test_a_resume_without_every_env_is_recorded_as_not_exact(make_central, tmp_path,
                                                            first, then, why):
  killed = _killed_after_round(make_central, _vtrace_catch, 'catch', tmp_path,
                               EVERY + 1, actor=first)
  assert killed['exact_until_round'] is None, killed['not_exact_because']
  _, summary, at = _run_to_end(make_central, _vtrace_catch, 'catch', tmp_path,
                               actor=then)
  assert at == EVERY
  assert summary['exact_until_round'] == EVERY, summary
  assert re.search(why, summary['not_exact_because']), summary['not_exact_because']
