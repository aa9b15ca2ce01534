"""How fast the learner step runs on this machine, variant by variant, in one run.

    .venv/bin/python bench/learner_speed.py            # every variant, ~6 min
    .venv/bin/python bench/learner_speed.py --quick    # two variants, short (CI smoke)
    .venv/bin/python bench/learner_speed.py --agent r2d2 --variants baseline,onednn,xla,intra1
        # R2D2's step with CartPole's defaults (MLP + LSTM 64, 29-step sequences)
    .venv/bin/python bench/learner_speed.py --agent ppo --seconds 30
        # PPO's whole step (10 epochs x 32 minibatches) on HalfCheetah-shaped unrolls

The Atari learner (Nature CNN, T=20) bounds Pong's wall clock on 2 cores: the queue is
full and acting waits for it (README, "Pong learns"). Each variant runs in its own
process (oneDNN and TF's thread pools are fixed at TensorFlow's import), on batches of
random uint8 frames with Pong's shapes (the step's cost does not depend on the pixels),
for a fixed time after a warm-up that traces the step. Variants run in two rounds in
opposite orders (ABC, CBA) so drift in the machine's load does not favour one;
the table gives each variant's transitions/s (median of its rounds) and its ratio to
the first variant, and `bench/results/learner_speed.json` keeps it all with the load.

`--agent r2d2` times R2D2's step instead (CartPole's registry defaults, batch 32,
random observations): alone, the step that a running R2D2 CartPole program takes
~65 times a second (its learner shares 2 cores with inference) -- the gap between the
two is what acting costs the learner (README, "R2D2 CartPole over seeds").
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  pylint: disable=g-import-not-at-top

# name -> (environment variables, VTraceConfig overrides, TF threads (intra, inter) or None)
VARIANTS: Dict[str, Any] = {
    'baseline': ({}, {}, None),
    'onednn': ({'TF_ENABLE_ONEDNN_OPTS': '1'}, {}, None),
    'xla': ({}, {'jit_compile': True}, None),
    'onednn+xla': ({'TF_ENABLE_ONEDNN_OPTS': '1'}, {'jit_compile': True}, None),
    'rmsprop': ({}, {'optimizer': 'rmsprop'}, None),
    'intra1': ({}, {}, (1, 1)),
    'onednn+intra2inter1': ({'TF_ENABLE_ONEDNN_OPTS': '1'}, {}, (2, 1)),
    # A reproducible run's pins (seedacme.runtime.machine_pins) that touch the step:
    # oneDNN capped at AVX2, OpenBLAS Haswell on one thread, 2 intra-op threads.
    'reproducible_pins': ({'TF_ENABLE_ONEDNN_OPTS': '1', 'ONEDNN_MAX_CPU_ISA': 'AVX2',
                           'OPENBLAS_CORETYPE': 'Haswell', 'OPENBLAS_NUM_THREADS': '1'},
                          {}, (2, 0)),
    # The same with oneDNN capped at AVX-512 (no AMX, VNNI, BF16): what an AVX-512 cap
    # would cost instead (such a run agrees only with AVX-512 CPUs).
    'pins_avx512': ({'TF_ENABLE_ONEDNN_OPTS': '1', 'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE',
                     'OPENBLAS_CORETYPE': 'Haswell', 'OPENBLAS_NUM_THREADS': '1'},
                    {}, (2, 0)),
    # Replay agents: gradient steps fused per compiled call (R2D2Config, SACConfig).
    'sgd4': ({}, {'sgd_steps_per_sample': 4}, None),
    'sgd8': ({}, {'sgd_steps_per_sample': 8}, None),
    'onednn+sgd4': ({'TF_ENABLE_ONEDNN_OPTS': '1'}, {'sgd_steps_per_sample': 4}, None),
    'onednn+sgd4+intra2inter1': ({'TF_ENABLE_ONEDNN_OPTS': '1'},
                                 {'sgd_steps_per_sample': 4}, (2, 1)),
}


def _child(args) -> None:
  """Runs one variant; prints one JSON line."""
  env_vars, overrides, threads = VARIANTS[args.variant]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if threads:
    tf.config.threading.set_intra_op_parallelism_threads(threads[0])
    tf.config.threading.set_inter_op_parallelism_threads(threads[1])
  make_step = {'r2d2': _r2d2_step, 'sac': _sac_step, 'ppo': _ppo_step}.get(args.agent,
                                                                           _vtrace_step)
  kwargs = {'env': args.env} if args.agent == 'r2d2' else {}
  step, transitions_per_step, overrides = make_step(args.batch_size, dict(overrides),
                                                    **kwargs)
  for i in range(3):  # trace and warm up
    step(i)
  steps, start = 0, time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    loss = step(steps)
    steps += 1
  elapsed = time.perf_counter() - start
  assert np.isfinite(float(loss)), loss
  print(json.dumps({'variant': args.variant, 'steps': steps, 'seconds': elapsed,
                    'step_ms': 1000 * elapsed / steps,
                    'transitions_per_s': steps * transitions_per_step / elapsed,
                    'sgd_steps_per_s': steps * overrides.get('sgd_steps_per_sample', 1)
                                       / elapsed,
                    'env': env_vars, 'overrides': overrides, 'threads': threads}))


def _vtrace_step(b: int, overrides: Dict[str, Any]):
  """(step(i) -> loss, transitions per step, overrides): V-trace on Pong-shaped unrolls."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.learning import VTraceLearner  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.networks import make_network  # pylint: disable=g-import-not-at-top
  config = registry.make_builder('vtrace', 'atari', batch_size=b, **overrides).config
  num_actions, t1 = 6, config.unroll_length + 1
  network = make_network(config.core, num_actions, config.hidden_sizes,
                         config.lstm_size, config.torso)
  learner = VTraceLearner(network, config, None)
  rng = np.random.RandomState(0)

  def batch():
    step_type = np.ones((b, t1), np.int32)
    step_type[:, 0] = 0
    return {'observation': tf.constant(rng.randint(0, 256, (b, t1, 84, 84, 4), np.uint8)),
            'step_type': tf.constant(step_type),
            'reward': tf.constant(rng.choice([-1.0, 0.0, 1.0], (b, t1), p=[.02, .96, .02]).astype(np.float32)),
            'discount': tf.constant(np.ones((b, t1), np.float32)),
            'action': tf.constant(rng.randint(0, num_actions, (b, t1)).astype(np.int32)),
            'logits': tf.constant(rng.normal(0, .1, (b, t1, num_actions)).astype(np.float32))}

  batches = [batch() for _ in range(4)]
  return (lambda i: learner.train_on(batches[i % 4])['loss'],
          b * config.unroll_length, overrides)


def _r2d2_step(b: int, overrides: Dict[str, Any], env: str = 'cartpole'):
  """(step(i) -> loss, transitions per step, overrides): R2D2 on the registry's
  sequences for `env` ('cartpole', or 'atari': Pong's 84x84x4 uint8 frames, 6 actions)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.r2d2.learning import R2D2Learner  # pylint: disable=g-import-not-at-top
  jit = overrides.pop('jit_compile', False)  # R2D2Config has no such field
  builder = registry.make_builder('r2d2', env, **{'batch_size': b, **overrides})
  config = builder.config
  b = config.batch_size  # a variant may set its own
  if env == 'atari':
    spec = envs.EnvSpec((84, 84, 4), 'uint8', 6)
  else:
    spec = envs.env_spec_of(envs.make_factory(env)(0))
  nets = builder.make_networks(spec)
  learner = R2D2Learner(nets.online, nets.target, config, None)  # no Reverb: fixed batch
  train = learner._train  # pylint: disable=protected-access
  if jit:
    train = tf.function(learner._train_step, jit_compile=True)  # pylint: disable=protected-access
  n = config.sequence_length
  b *= config.sgd_steps_per_sample  # one call: that many steps, each on its own batch
  rng = np.random.RandomState(0)
  step_type = np.ones((b, n), np.int8)
  step_type[:, 0] = 0
  frames = spec.dtype == np.uint8 or str(spec.dtype) == 'uint8'
  batch = {'observation': tf.constant(
               rng.randint(0, 256, (b, n) + spec.observation_shape).astype(np.uint8)
               if frames else
               rng.normal(size=(b, n) + spec.observation_shape).astype(np.float32)),
           'reward': tf.ones((b, n)), 'discount': tf.ones((b, n)),
           'step_type': tf.constant(step_type),
           'action': tf.constant(rng.randint(0, spec.num_actions, (b, n)).astype(np.int32)),
           'initial_state': (tf.zeros((b, config.lstm_size)),) * 2}
  weights = tf.ones((b,))

  def step(_):
    priorities, metrics = train(batch, weights)
    priorities.numpy()  # wait for the step, as the learner does for its priority updates
    return metrics['loss']

  return step, b * config.trace_length, dict(overrides, jit_compile=jit)


def _sac_step(b: int, overrides: Dict[str, Any]):
  """(step(i) -> loss, transitions per step, overrides): SAC on HalfCheetah's items."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.sac.learning import SACLearner  # pylint: disable=g-import-not-at-top
  overrides.pop('jit_compile', None)  # SACConfig has no such field
  builder = registry.make_builder('sac', 'mujoco', batch_size=b, **overrides)
  spec = envs.env_spec_of(envs.make_factory('mujoco', level='HalfCheetah-v5')(0))
  learner = SACLearner(builder.make_networks(spec), builder.config, None,
                       layout=builder.layout(spec))
  k = builder.config.sgd_steps_per_sample
  rng = np.random.RandomState(0)
  shape = (b * k, builder.item_steps)
  fields = {'observation': rng.normal(size=shape + spec.observation_shape),
            'reward': rng.normal(size=shape).astype(np.float32),
            'discount': np.ones(shape, np.float32), 'step_type': np.ones(shape, np.int8),
            'raw_action': rng.normal(size=shape + (int(spec.action_size),)).astype(
                np.float32)}
  layout = builder.layout(spec)  # sampled batches arrive packed (packed_items)
  batch = tf.nest.map_structure(tf.constant,
                                layout.pack(fields) if layout is not None else fields)
  return (lambda i: learner.train_on(batch)['critic_loss'], b * k, overrides)


def _ppo_step(b: int, overrides: Dict[str, Any]):
  """(step(i) -> loss, transitions per step, overrides): PPO's whole learner step (10
  epochs x 32 minibatches of 64 at the MuJoCo defaults) on HalfCheetah-shaped unrolls."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.ppo.learning import PPOLearner  # pylint: disable=g-import-not-at-top
  from seedacme.types import FIRST, MID  # pylint: disable=g-import-not-at-top
  overrides.pop('jit_compile', None)  # PPOConfig has no such field
  builder = registry.make_builder('ppo', 'mujoco', batch_size=b, **overrides)
  spec = envs.env_spec_of(envs.make_factory('mujoco', level='HalfCheetah-v5')(0))
  signature = builder.item_signature(spec)
  learner = PPOLearner(builder.make_networks(spec), builder.config, None, signature)
  rng = np.random.RandomState(0)
  batch = {}
  for name, s in signature.items():
    shape = (b,) + tuple(s.shape)
    if name == 'step_type':
      value = np.full(shape, MID)
      value[:, 0] = FIRST
    elif name == 'env_id':
      value = np.repeat(np.arange(b)[:, None], shape[1], 1)
    elif name == 'policy_version':
      value = np.zeros(shape)
    elif name == 'log_prob':
      value = rng.normal(-6.0, 1.0, shape)
    else:
      value = rng.normal(size=shape)
    batch[name] = tf.constant(value.astype(s.dtype.as_numpy_dtype))
  config = builder.config
  # One random batch trained on again and again drives the policy away from the
  # batch's log-probs until the loss is not finite (seen at step 49 of a 15 s run):
  # every few steps the network and optimizer go back to their state after the first
  # step (a few hundred us of assigns against a step of ~10^2 ms, inside the timing).
  snapshot: List[tuple] = []

  def step(i: int):
    loss = learner.train_on(batch)['loss']
    if not snapshot:  # after the first step, when Adam's slots exist
      snapshot.extend((v, v.numpy()) for key in ('network', 'optimizer')
                      for v in learner.checkpoint_state()[key].variables)
    elif i % 8 == 7:
      for variable, value in snapshot:
        variable.assign(value)
    return loss

  return step, b * config.unroll_length, overrides


def _run_variant(name: str, batch_size: int, seconds: float, agent: str = 'vtrace',
                 env_name: str = 'cartpole', custom: List[str] = ()) -> Dict[str, Any]:
  env = dict(os.environ, PYTHONPATH=harness.REPO, TF_CPP_MIN_LOG_LEVEL='2')
  env['TF_ENABLE_ONEDNN_OPTS'] = '0'  # TF 2.8's own default; variants turn it on
  env.update(VARIANTS[name][0])
  out = subprocess.run([sys.executable, os.path.abspath(__file__), '--child', name,
                        '--batch_size', str(batch_size), '--seconds', str(seconds),
                        '--agent', agent, '--env', env_name,
                        *[f'--custom={c}' for c in custom]],
                       env=env, capture_output=True, text=True, timeout=seconds + 300,
                       check=False)
  lines = [ln for ln in out.stdout.splitlines() if ln.startswith('{')]
  if out.returncode != 0 or not lines:
    raise RuntimeError(f'variant {name} failed ({out.returncode}): {out.stderr[-2000:]}')
  return json.loads(lines[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--variants', default=None,
                      help='default: all (V-trace); baseline,onednn,xla,intra1 (R2D2: its '
                      'config has no optimizer field)')
  parser.add_argument('--agent', default='vtrace', choices=['vtrace', 'r2d2', 'sac', 'ppo'])
  parser.add_argument('--env', default='cartpole', choices=['cartpole', 'atari'],
                      help="R2D2's shapes and registry defaults")
  parser.add_argument('--batch_size', type=int, default=None,
                      help='default: 8 (V-trace, Pong shapes), 32 (R2D2, CartPole)')
  parser.add_argument('--seconds', type=float, default=20.0)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--custom', action='append', default=[], metavar='NAME:F=V,F=V',
                      help='a variant of config overrides (oneDNN on, as the product '
                      "runs), e.g. --custom 'b16t20:batch_size=16,trace_length=20'; list "
                      'it in --variants')
  parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--out', default=None,
                      help='default learner_speed.json (V-trace), learner_speed_r2d2.json')
  args = parser.parse_args()
  from launchers.program_flags import parse_overrides  # pylint: disable=g-import-not-at-top
  for custom in args.custom:
    name, _, fields = custom.partition(':')
    VARIANTS[name] = ({'TF_ENABLE_ONEDNN_OPTS': '1'},
                      parse_overrides(fields.split(',') if fields else []), None)
  r2d2 = args.agent == 'r2d2'
  if args.batch_size is None:
    args.batch_size = {'r2d2': 32, 'ppo': 16}.get(args.agent, 8)
  if args.variants is None and args.agent == 'ppo':
    args.variants = 'baseline'
  if args.variants is None:
    args.variants = 'baseline,onednn,xla,intra1' if r2d2 else ','.join(VARIANTS)
  if args.out is None:
    args.out = {'vtrace': 'learner_speed.json'}.get(args.agent,
                                                    f'learner_speed_{args.agent}.json')
  if args.child:
    args.variant = args.child
    _child(args)
    return
  names = args.variants.split(',')
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    parser.error(f'unknown variants {unknown}; known: {sorted(VARIANTS)}')
  if args.quick:
    names, args.seconds, args.rounds = ['baseline', 'xla'], 4.0, 1
  load_before = os.getloadavg()[0]
  results: Dict[str, List[Dict[str, Any]]] = {n: [] for n in names}
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      res = _run_variant(name, args.batch_size, args.seconds, args.agent, args.env,
                         args.custom)
      res['load'] = os.getloadavg()[0]
      results[name].append(res)
      print(f'  round {r + 1}: {name:<22} {res["transitions_per_s"]:8,.0f} transitions/s '
            f'({res["step_ms"]:.0f} ms/step, load {res["load"]:.1f})', flush=True)
  base = float(np.median([x['transitions_per_s'] for x in results[names[0]]]))
  rows = []
  for name in names:
    tps = float(np.median([x['transitions_per_s'] for x in results[name]]))
    rows.append({'variant': name, 'batch': args.batch_size,
                 'transitions/s': tps, 'ms/step': float(np.median([x['step_ms'] for x in results[name]])),
                 f'vs {names[0]}': tps / base,
                 'rounds': [round(x['transitions_per_s']) for x in results[name]]})
  what = {'r2d2': 'R2D2 learner step, CartPole defaults (MLP + LSTM, 29-step sequences)',
          'sac': 'SAC learner step, HalfCheetah items (256-256 MLPs)',
          'ppo': 'PPO learner step, HalfCheetah unrolls (MuJoCo defaults)'}.get(
              args.agent, 'V-trace learner step, Nature CNN, T=20')
  print(f'\n{what}, batch {args.batch_size} '
        f'(load {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)')
  harness.print_table(rows, ['variant', 'batch', 'transitions/s', 'ms/step', f'vs {names[0]}'])
  path = harness.write_json(args.out, {
      'machine': harness.machine(), 'load_start': load_before, 'load_end': os.getloadavg()[0],
      'agent': args.agent, 'batch_size': args.batch_size, 'seconds_per_round': args.seconds,
      'rows': rows, 'runs': results})
  print(f'wrote {path}')


if __name__ == '__main__':
  main()
