"""Probes of the V-trace learner on real Pong frames: what an optimizer does to the net.

Pong's training average sat at random's for the first 2M env steps (README, "Pong
learns"), and a 1M-env-step run costs ~20 minutes here, so settings are first compared
on what a few hundred updates show: unrolls of random Pong play (real frames and
rewards, from ale-py's vector engine) are trained on for N updates, and per layer we
read how far the parameters moved per update (mean |step|) relative to the learning rate (Adam
moves every weight by ~lr when epsilon is negligible; epsilon or a small RMSprop
mean square shrinks that), which conv units are still alive, and how much the value
differs between frames. `tests/unit/test_atari_vtrace_torso.py` and
`bench/optimizer_probe.py` use it.
"""

from typing import Any, Dict, List

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


def probe(learner, network, unrolls, batch_size: int, updates: int,
          learning_rate: float, seed: int = 1) -> Dict[str, Any]:
  """Trains `learner` on random batches of `unrolls`; reports what moved and how much."""
  frames = tf.constant(np.stack([u['observation'][0] for u in unrolls[::2]]))
  torso = network.torso
  alive_before = conv_alive(torso, frames)
  rng = np.random.RandomState(seed)
  variables = network.trainable_variables
  step_sizes: List[List[float]] = [[] for _ in variables]
  metrics = {}
  for i in range(updates):
    idx = rng.choice(len(unrolls), batch_size, replace=False)
    before = [v.numpy() for v in variables] if i >= updates - 10 else None
    metrics = learner.train_on({k: tf.constant(np.stack([unrolls[j][k] for j in idx]))
                                for k in unrolls[0]})
    if before is not None:
      for s, v, b in zip(step_sizes, variables, before):
        s.append(float(np.mean(np.abs(v.numpy() - b))) / learning_rate)
  (_, values), _ = network(frames, ())
  return {'alive_before': alive_before.tolist(),
          'alive_after': conv_alive(torso, frames).tolist(),
          'step_over_lr': [{'name': v.name, 'shape': v.shape.as_list(),
                            'value': float(np.mean(s))} for v, s in zip(variables, step_sizes)],
          'value_spread': float(np.std(values.numpy())),
          'entropy': metrics.get('entropy'), 'loss': metrics.get('loss')}
