"""A seed names a run (issue 63): the same reproducible run on 2 x 8, 4 x 4 and 1 x 16
actors x envs, and beside two busy loops, gives the same round records (returns,
episode counts, losses at every round) and the same final weights.

In process: a real central node (Reverb queue, inference server with its round gate,
learner loop, run monitor) and actor threads calling it (`make_central`). What differs
between the runs is what the issue says must not matter: how the envs are split over
actors (so how requests arrive and in what order), and the machine's load (so which
thread runs when). V-trace on Catch and PPO on CartPole, 20 learner steps each.
"""

import json
import subprocess
import sys

import pytest

from seedacme.agents import ppo, registry, vtrace

STEPS = 20  # learner steps of every run (one round of 16 unrolls each: 21 records)




def _run(make_central, tmp_path, builder_fn, env, num_actors, envs_per_actor, busy=0):
  """One reproducible run to `STEPS` learner steps: (round records, summary)."""
  logdir = tmp_path / f'{env}-{num_actors}x{envs_per_actor}-busy{busy}'
  central, _, actors, _ = make_central(
      builder_fn(), env, num_actors, envs_per_actor, reproducible=True,
      max_learner_steps=STEPS, checkpoint_interval_s=None, export_policy=False,
      logdir=str(logdir), progress_interval_s=1.0, seed=3)
  loops = [subprocess.Popen([sys.executable, '-c', 'while True: pass'])
           for _ in range(busy)]
  try:
    for a in actors:
      a.start()
    central.run()  # ends by itself: the round where the learner budget is met
  finally:
    for p in loops:
      p.kill()
      p.wait()
  assert all(a.error is None for a in actors), [a.error for a in actors]
  with open(logdir / 'rounds.jsonl') as f:
    rounds = [json.loads(line) for line in f]
  return rounds, central.summary


def _check_run(rounds, summary):
  assert summary['stop']['kind'] == 'learner_steps', summary['stopped_because']
  assert summary['reproducible'] and summary['exact_until_round'] is None, summary
  assert [r['round'] for r in rounds] == list(range(STEPS + 1))
  assert [r['learner_steps'] for r in rounds] == list(range(STEPS + 1))
  assert rounds[-1]['episodes'] > 0
  # The records carry the learner's metrics (which change every step) and returns.
  losses = [r['learner_loss'] for r in rounds[1:]]
  assert len(set(losses)) == len(losses), losses


def _vtrace_catch():
  return vtrace.VTraceBuilder(registry.make_config('vtrace', 'catch', batch_size=16,
                                                   unroll_length=10, seed=3))


def _ppo_cartpole():
  return ppo.PPOBuilder(registry.make_config('ppo', 'cartpole', unroll_length=16, seed=3))


@pytest.mark.timeout(240)
def test_vtrace_catch_is_the_same_run_on_any_split_and_under_load(make_central, tmp_path):
  first, summary = _run(make_central, tmp_path, _vtrace_catch, 'catch', 2, 8)
  _check_run(first, summary)
  for num_actors, envs_per_actor, busy in ((4, 4, 2), (1, 16, 0)):
    rounds, other = _run(make_central, tmp_path, _vtrace_catch, 'catch', num_actors,
                         envs_per_actor, busy)
    assert rounds == first, (num_actors, envs_per_actor, busy)
    assert other['weights_sha256'] == summary['weights_sha256']


@pytest.mark.timeout(240)
def test_ppo_cartpole_is_the_same_run_on_any_split(make_central, tmp_path):
  first, summary = _run(make_central, tmp_path, _ppo_cartpole, 'cartpole', 2, 8)
  _check_run(first, summary)
  rounds, other = _run(make_central, tmp_path, _ppo_cartpole, 'cartpole', 4, 4)
  assert rounds == first
  assert other['weights_sha256'] == summary['weights_sha256']
