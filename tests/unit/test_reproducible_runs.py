"""A seed names a run (issue 63): the same reproducible run on 2 x 8, 4 x 4 and 1 x 16
actors x envs, and beside two busy loops, gives the same round records (returns,
episode counts, losses at every round) and the same final weights.

In process: a real central node (Reverb queue, inference server with its round gate,
learner loop, run monitor) and actor threads calling it (`make_central`). What differs
between the runs is what the issue says must not matter: how the envs are split over
actors (so how requests arrive and in what order), and the machine's load (so which
thread runs when). V-trace on Catch and PPO on CartPole, 20 learner steps each. And
the lagged schedule (`reproducible_lag=1`: round r acts while the learner trains on
round r - 1) is as exact, and another run than lag 0's.
"""


import pytest

from seedacme.agents import ppo, registry, vtrace
from seedacme.nodes.central import weights_sha256
from tests.unit.in_process import run_to_its_end

STEPS = 20  # learner steps of every run (one round of 16 unrolls each: 21 records)




def _run(make_central, tmp_path, builder_fn, env, num_actors, envs_per_actor, busy=0,
         lag=0, steps=STEPS, watch=None):
  """One reproducible run to `steps` learner steps: (round records, summary);
  `watch(central)` before it starts."""
  logdir = tmp_path / f'{env}-{num_actors}x{envs_per_actor}-busy{busy}-lag{lag}'
  central, _, actors, _ = make_central(
      builder_fn(), env, num_actors, envs_per_actor, reproducible=True,
      reproducible_lag=lag, max_learner_steps=steps, checkpoint_interval_s=None,
      export_policy=False, logdir=str(logdir), progress_interval_s=1.0, seed=3)
  if watch is not None:
    watch(central)
  # Ends by itself: the round where the learner budget is met.
  return run_to_its_end(central, actors, logdir, busy), central.summary


def _check_run(rounds, summary, lag=0, steps=STEPS):
  """One learner step per round (16 unrolls, batch 16): round r acts after
  max(0, r - lag) steps, and the run ends at the round that reaches `steps`."""
  assert summary['stop']['kind'] == 'learner_steps', summary['stopped_because']
  assert summary['reproducible'] and summary['exact_until_round'] is None, summary
  assert [r['round'] for r in rounds] == list(range(steps + lag + 1))
  assert [r['learner_steps'] for r in rounds] == [0] * lag + list(range(steps + 1))
  assert rounds[-1]['episodes'] > 0
  # The records carry the learner's metrics (which change every step) and returns.
  losses = [r['learner_loss'] for r in rounds[lag + 1:]]
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


LAG_STEPS = 12  # fewer steps: the lag's runs are the fourth to sixth of this file


class _Versions:
  """Which weights each round acted with: the hash of inference's copy once the round
  gate set it, and of the learner's policy after each step (on the learner's thread,
  as the step ends)."""

  def __init__(self):
    self.after_step, self.acted = {}, []

  def __call__(self, central):
    learner = central._policy_variables  # pylint: disable=protected-access
    acting = central._builder.policy_network(central._inference_networks).variables  # pylint: disable=protected-access
    assert acting[0] is not learner[0]  # a lagged run acts on a copy
    self.after_step[0] = weights_sha256(learner)
    note, sync = central.clock.note_learner_steps, central.rounds._sync_weights  # pylint: disable=protected-access

    def noted(steps):
      self.after_step[steps] = weights_sha256(learner)
      note(steps)

    def synced():
      sync()
      self.acted.append(weights_sha256(acting))
    central.clock.note_learner_steps, central.rounds._sync_weights = noted, synced  # pylint: disable=protected-access


@pytest.mark.timeout(240)
def test_lag_1_is_the_same_run_on_any_split_and_not_lag_0s(make_central, tmp_path):
  versions = _Versions()
  first, summary = _run(make_central, tmp_path, _vtrace_catch, 'catch', 2, 8, lag=1,
                        steps=LAG_STEPS, watch=versions)
  _check_run(first, summary, lag=1, steps=LAG_STEPS)
  # Round r acted with the learner's weights after its S(r) steps, no later ones
  # (the learner trained on round r - 1 meanwhile).
  assert len(versions.acted) == len(first)
  assert versions.acted == [versions.after_step[r['learner_steps']] for r in first]
  assert len(set(versions.acted)) == LAG_STEPS + 1
  rounds, other = _run(make_central, tmp_path, _vtrace_catch, 'catch', 4, 4, lag=1,
                       steps=LAG_STEPS)
  assert rounds == first
  assert other['weights_sha256'] == summary['weights_sha256']
  # Lag 0 from the same seed: round 1 acts after one learner step, not none, so from
  # there on the returns, losses and the final weights are another run's.
  unlagged, plain = _run(make_central, tmp_path, _vtrace_catch, 'catch', 2, 8,
                         steps=LAG_STEPS)
  _check_run(unlagged, plain, steps=LAG_STEPS)
  assert unlagged[0] == first[0]  # round 0: the initial weights in both
  assert [r['learner_loss'] for r in unlagged[1:LAG_STEPS]] != \
      [r['learner_loss'] for r in first[2:LAG_STEPS + 1]]
  assert plain['weights_sha256'] != summary['weights_sha256']
