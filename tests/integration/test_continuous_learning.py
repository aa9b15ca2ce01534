"""PPO learns a continuous-control task in the real multi-process program.

The other continuous-control tests only show that MuJoCo runs end to end or that one
learner step moves the loss; this fails when the return does not rise. It runs
`run_local mujoco ppo 2 8 --level InvertedPendulum-v5` until the greedy
evaluator's average over its last 20 episodes reaches 950 (gymnasium's solved
threshold; the maximum is 1000, +1 per step for 1000 steps), and checks that the
evaluator started far below it.

Why 950 cannot be luck (measured, 100 episodes each): uniform random actions average
5.6 (max 22), zero actions 24.4 (max 57); the untrained greedy policy's first
evaluations here read 15-30.

Why PPO's settings are overridden (`--agent_config`): the registry's MuJoCo defaults
are for 1M-step tasks. With them (2,048 transitions, 10 epochs of 32 minibatches per
learner step) the greedy return was 659 after 150 s; with 512 transitions x 4 epochs
of 4 minibatches at lr 1e-3, 692 after 100 s and 1000 (target met) after 150 s and 50k
env steps (2 x 8 envs, nice 19, load 8-12 from other jobs).

SAC's test (issue 36) is not here yet: no SAC setting tried reached the target in a
test's time. Measured under a load of ~11 from other sessions' programs (the SAC step
alone on HalfCheetah-shaped items ran 34/s with 64-64 nets at batch 128, 10/s with
256-256 at 256), with `run_local mujoco sac 2 4`, 64-64 nets, lr 1e-3, initial_alpha
0.2, min_replay_size 1000, sgd_steps_per_sample 4: batch 128 at samples_per_insert 64
(half a gradient step per env step) reached a greedy ~100 after 1.5k gradient steps
and stayed there to 6k (150 s); with n_step 3 and tau 0.01 besides, 182 after 11k
gradient steps and 25k env steps (300 s, 400 s wall); batch 256, samples_per_insert
128, n_step 3, tau 0.02: 49 after 2.5k. The learner set the pace (40-55 gradient
steps/s in the program; the actors waited on the limiter), so what the test needs is
fewer gradient steps to the target, not a higher update-to-data ratio. In the 300 s
run the temperature rose from 0.2 to ~0.55 and held the entropy at its target (-1)
while the critics' Q (~30) stayed far below a balancing policy's (~100 at gamma 0.99).
Startup under that load: inference compiled in 20-53 s, the learner step traced in
22-38 s.

20 evaluator envs (the launcher's default is 4): the target watches the last 20 greedy
episodes, and a solved policy's are 1000 steps long. The evaluator steps its envs as one
batch, so one round of 20 fills the window at once; with 16 a PPO run sat at a greedy
821 for 50 s (load ~8) waiting for the next round to end.

Time: the programs are bounded by `--max_seconds` (running time) and by a wait with a
kill; `Run.complete` checks that no process carrying the test's tag is left.
"""

import pytest

from tests.integration.launch import Run, target_value

pytestmark = pytest.mark.integration

SOLVED = 950.0
UNTRAINED_BELOW = 100.0  # first greedy evaluations: ~15-30 (zero actions: 24)
MAX_SECONDS = 200  # running time; startup (imports, tracing) comes on top

PPO_OVERRIDES = ('unroll_length=64', 'batch_size=8', 'queue_size=8', 'epochs=4',
                 'num_minibatches=4', 'learning_rate=1e-3')


def _solve_inverted_pendulum(tmp_path, agent, envs_per_actor, overrides):
  args = ['mujoco', agent, '2', str(envs_per_actor), '--level', 'InvertedPendulum-v5',
          '--target_return', str(SOLVED), '--target_on', 'eval', '--num_eval_envs', '20',
          '--max_seconds', str(MAX_SECONDS), '--checkpoint_interval_s', '0',
          '--progress_interval_s', '2']
  for override in overrides:
    args += ['--agent_config', override]
  with Run(args, str(tmp_path)) as run:
    run.complete(MAX_SECONDS + 150)
  summary = run.json('summary.json')
  evals = [(r['env_steps'], r['eval_average_return']) for r in run.progress()
           if r.get('eval_average_return') is not None]
  # The rise, printed for the log (pytest -s) and named in any failure.
  rise = f'{agent}: greedy return {evals[0][1]:.0f} -> {evals[-1][1]:.0f} ' \
         f'(env steps {evals[-1][0]:,}, {summary["run_elapsed_s"]:.0f} s running)'
  print(rise)
  assert summary['stop']['kind'] == 'eval_target', (summary['stopped_because'], rise)
  assert target_value(summary) >= SOLVED, rise
  assert evals[0][1] < UNTRAINED_BELOW, rise


@pytest.mark.timeout(MAX_SECONDS + 200)
def test_ppo_solves_inverted_pendulum(tmp_path):
  _solve_inverted_pendulum(tmp_path, 'ppo', 8, PPO_OVERRIDES)

