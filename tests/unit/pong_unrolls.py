"""Real Pong frames for learner tests: unrolls of random play, and which conv units live.

Test support (not a test): `test_atari_vtrace_torso.py` and `test_vtrace_optimizers.py`
train on these, and `bench/probes.py` (the optimizer study) reads them too.
"""

from typing import Dict, List

import numpy as np
import tensorflow as tf

from seedacme.networks import to_float


def random_play_unrolls(game: str = 'Pong', num_envs: int = 16, unroll_length: int = 20,
                        segments: int = 8, seed: int = 3,
                        action_seed: int = 0) -> List[Dict[str, np.ndarray]]:
  """`num_envs * segments` V-trace unrolls (`[T+1, ...]` each) of uniformly random play.

  `seed` seeds the emulators, `action_seed` the random actions.
  """
  from seedacme.envs.atari_vector import AtariVectorEnv  # pylint: disable=g-import-not-at-top
  env = AtariVectorEnv(game, num_envs, seed=seed)
  rng = np.random.RandomState(action_seed)
  steps = []
  try:
    ts = env.reset()
    for _ in range(unroll_length * segments + 1):
      action = rng.randint(env.spec.num_actions, size=num_envs).astype(np.int32)
      steps.append(dict(observation=np.asarray(ts.observation),
                        step_type=np.asarray(ts.step_type),
                        reward=np.asarray(ts.reward, np.float32),
                        discount=np.asarray(ts.discount, np.float32), action=action,
                        logits=np.zeros((num_envs, env.spec.num_actions), np.float32)))
      ts = env.step(action)
  finally:
    env.close()
  unrolls = []
  for start in range(0, unroll_length * segments, unroll_length):
    segment = steps[start:start + unroll_length + 1]
    for e in range(num_envs):
      unrolls.append({k: np.stack([s[k][e] for s in segment]) for k in segment[0]})
  return unrolls


def conv_alive(torso, frames: tf.Tensor) -> np.ndarray:
  """Per conv layer of a Nature CNN torso: fraction of channels active on some frame."""
  x, alive = to_float(frames), []
  for conv in torso.convs:
    x = tf.nn.relu(conv(x))
    alive.append(float((x.numpy().reshape(-1, x.shape[-1]) > 0).any(0).mean()))
  return np.array(alive)
