"""Which way up a trained planar MuJoCo policy runs: its greedy return and body angle.

    .venv/bin/python bench/mujoco_posture.py bench/results/mujoco/<out>/HalfCheetah-v5_ppo_s0 \
        [more run dirs] --out mujoco_halfcheetah_posture

Why it exists: PPO's HalfCheetah-v5 runs end in two groups at 1M env steps, ~1,600-1,800
and 3,500-5,700 (bench/published/mujoco_ppo_*.json). An episode of HalfCheetah never ends
when the body turns over (Hopper's and Walker2d's do: the torso angle is part of their
health check; Ant's ends when the torso leaves its height range), and a policy can learn
to run on its back. This tells the two apart from the run's exported policy
(<logdir>/saved_model, written at the end of every run), not from a video: each episode
is played greedily (the Normal's mean, clipped into the bounds) for the task's full
length from a fixed reset seed, and reports the return and the share of steps, after
the first 200, with the root's pitch (qpos[2] of the planar models: `rooty`) past a
quarter turn either way (|angle| > pi/2): 1.0 is a cheetah running on its back.

Only the planar tasks (HalfCheetah, Hopper, Walker2d), whose qpos[2] is the pitch;
another task is refused by name. Reads the task from the run's saved config
(`checkpoints/run_config.json`). Writes bench/results/<out>.json (machine, commit,
command, a row per run), then copies it to bench/published/ (with --publish).
"""

import argparse
import json
import math
import os
import shutil
import sys
from typing import Any, Dict

import numpy as np

import harness

from seedacme.run import logdir as logdir_lib

PLANAR = ('HalfCheetah', 'Hopper', 'Walker2d')
SETTLE_STEPS = 200  # the first steps leave the reset pose: not counted


def task_of(logdir: str) -> str:
  """The run's MuJoCo level, from its saved config (seedacme.run.identity)."""
  path = os.path.join(logdir, 'checkpoints', 'run_config.json')
  if not os.path.isfile(path):
    raise SystemExit(f'mujoco_posture: {path} is missing: not a run dir')
  with open(path) as f:
    level = json.load(f)['config'].get('env_args', {}).get('level')
  if not level or not level.startswith(PLANAR):
    raise SystemExit(f'mujoco_posture: {logdir}: task {level!r} is not one of the planar '
                     f'tasks {PLANAR} whose qpos[2] is the body pitch')
  return level


def play(logdir: str, level: str, seed: int) -> Dict[str, Any]:
  """One greedy episode of the run's exported policy: return, length, pitch shares."""
  import gymnasium
  import tensorflow as tf
  policy = tf.saved_model.load(os.path.join(logdir, 'saved_model'))
  env = gymnasium.make(level)
  low, high = env.action_space.low, env.action_space.high
  obs, _ = env.reset(seed=seed)
  state, ret, pitch = policy.initial_state(1), 0.0, []
  for _ in range(10_000):
    (params, _), state = policy.step(tf.constant(obs[None], tf.float32), state)
    action = np.clip(params['mean'].numpy()[0], low, high)
    obs, reward, terminated, truncated, _ = env.step(action)
    ret += float(reward)
    pitch.append(float(env.unwrapped.data.qpos[2]))
    if terminated or truncated:
      break
  env.close()
  settled = np.asarray(pitch[SETTLE_STEPS:] or pitch)
  # The pitch is unwrapped (a full flip is 2 pi): fold it into (-pi, pi].
  folded = np.angle(np.exp(1j * settled))
  return {'greedy_return': ret, 'length': len(pitch),
          'share_past_quarter_turn': float((np.abs(folded) > math.pi / 2).mean()),
          'mean_abs_pitch': float(np.abs(folded).mean())}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('runs', nargs='+',
                      help='run dirs (with saved_model/ and checkpoints/run_config.json)')
  parser.add_argument('--seed', type=int, default=123, help='the env reset seed')
  parser.add_argument('--out', default='mujoco_posture')
  parser.add_argument('--publish', action='store_true', help='copy to bench/published')
  args = parser.parse_args()
  rows = []
  for logdir in args.runs:
    level = task_of(logdir)
    summary = logdir_lib.read_summary(logdir) or {}
    rows.append({'run': os.path.relpath(os.path.abspath(logdir), harness.REPO),
                 'task': level, 'training_average_at_end': summary.get('average_return'),
                 'env_steps': summary.get('env_steps'), **play(logdir, level, args.seed)})
    print(f"mujoco_posture: {rows[-1]['run']}: greedy {rows[-1]['greedy_return']:.0f}, "
          f"past a quarter turn {rows[-1]['share_past_quarter_turn']:.2f}", flush=True)
  payload = {'machine': harness.machine(), **harness.commit(),
             'command': ' '.join(['.venv/bin/python', 'bench/mujoco_posture.py',
                                  *sys.argv[1:]]),
             'seed': args.seed, 'settle_steps': SETTLE_STEPS, 'runs': rows}
  path = harness.write_json(f'{args.out}.json', payload)
  harness.print_table(rows, ['run', 'training_average_at_end', 'greedy_return', 'length',
                             'share_past_quarter_turn', 'mean_abs_pitch'])
  if args.publish:
    path = shutil.copy(path, os.path.join(harness.REPO, 'bench', 'published'))
  print(f'mujoco_posture: wrote {os.path.relpath(path, harness.REPO)}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
