"""How fast the V-trace learner step runs on this machine, variant by variant, in one run.

    .venv/bin/python bench/learner_speed.py            # every variant, ~6 min
    .venv/bin/python bench/learner_speed.py --quick    # two variants, short (CI smoke)

The Atari learner (Nature CNN, T=20) bounds Pong's wall clock on 2 cores: the queue is
full and acting waits for it (README, "Pong learns"). Each variant runs in its own
process (oneDNN and TF's thread pools are fixed at TensorFlow's import), on batches of
random uint8 frames with Pong's shapes (the step's cost does not depend on the pixels),
for a fixed time after a warm-up that traces the step. Variants run in two rounds in
opposite orders (ABC, CBA) so drift in the machine's load does not favour one;
the table gives each variant's transitions/s (median of its rounds) and its ratio to
the first variant, and `bench/results/learner_speed.json` keeps it all with the load.
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
}


def _child(args) -> None:
  """Runs one variant; prints one JSON line."""
  env_vars, overrides, threads = VARIANTS[args.variant]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if threads:
    tf.config.threading.set_intra_op_parallelism_threads(threads[0])
    tf.config.threading.set_inter_op_parallelism_threads(threads[1])
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.learning import VTraceLearner  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.networks import make_network  # pylint: disable=g-import-not-at-top
  config = registry.make_builder('vtrace', 'atari', batch_size=args.batch_size,
                                 **overrides).config
  num_actions, t1, b = 6, config.unroll_length + 1, args.batch_size
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
  for i in range(3):  # trace and warm up
    learner.train_on(batches[i % 4])
  steps, start = 0, time.perf_counter()
  while time.perf_counter() - start < args.seconds:
    metrics = learner.train_on(batches[steps % 4])
    steps += 1
  elapsed = time.perf_counter() - start
  assert np.isfinite(metrics['loss']), metrics
  print(json.dumps({'variant': args.variant, 'steps': steps, 'seconds': elapsed,
                    'step_ms': 1000 * elapsed / steps,
                    'transitions_per_s': steps * b * config.unroll_length / elapsed,
                    'env': env_vars, 'overrides': overrides, 'threads': threads}))


def _run_variant(name: str, batch_size: int, seconds: float) -> Dict[str, Any]:
  env = dict(os.environ, PYTHONPATH=harness.REPO, TF_CPP_MIN_LOG_LEVEL='2')
  env['TF_ENABLE_ONEDNN_OPTS'] = '0'  # TF 2.8's own default; variants turn it on
  env.update(VARIANTS[name][0])
  out = subprocess.run([sys.executable, os.path.abspath(__file__), '--child', name,
                        '--batch_size', str(batch_size), '--seconds', str(seconds)],
                       env=env, capture_output=True, text=True, timeout=seconds + 300,
                       check=False)
  lines = [ln for ln in out.stdout.splitlines() if ln.startswith('{')]
  if out.returncode != 0 or not lines:
    raise RuntimeError(f'variant {name} failed ({out.returncode}): {out.stderr[-2000:]}')
  return json.loads(lines[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--variants', default=','.join(VARIANTS))
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--seconds', type=float, default=20.0)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
  parser.add_argument('--out', default='learner_speed.json')
  args = parser.parse_args()
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
      res = _run_variant(name, args.batch_size, args.seconds)
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
  print(f'\nV-trace learner step, Nature CNN, T=20, batch {args.batch_size} '
        f'(load {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)')
  harness.print_table(rows, ['variant', 'batch', 'transitions/s', 'ms/step', f'vs {names[0]}'])
  path = harness.write_json(args.out, {
      'machine': harness.machine(), 'load_start': load_before, 'load_end': os.getloadavg()[0],
      'batch_size': args.batch_size, 'seconds_per_round': args.seconds,
      'rows': rows, 'runs': results})
  print(f'wrote {path}')


if __name__ == '__main__':
  main()
