"""Optimizer settings compared on real Pong frames over a few hundred learner updates.

    .venv/bin/python bench/optimizer_probe.py             # every setting, ~4 min
    .venv/bin/python bench/optimizer_probe.py --quick     # two settings, 20 updates

For each setting (a V-trace config on top of the registry's Atari defaults) the same
unrolls of random Pong play are trained on for `--updates` updates from the same
initial network (`bench/probes.py`). The table gives, per layer, the mean
parameter step divided by the learning rate over the last 10 updates (Adam with a
negligible epsilon gives ~1: every weight moves by ~lr), the conv units alive before ->
after, and the value's spread over frames. It explains; the Pong runs decide
(README, "Pong learns").
"""

import argparse
import os
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The repository root: the random-play unrolls are the tests' (tests/unit/pong_unrolls.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  pylint: disable=g-import-not-at-top

SETTINGS: Dict[str, Dict[str, Any]] = {
    'adam eps1e-3 (defaults until now)': dict(optimizer='adam', adam_epsilon=1e-3),
    'adam eps1e-5': dict(optimizer='adam', adam_epsilon=1e-5),
    'adam eps1e-7': dict(optimizer='adam', adam_epsilon=1e-7),
    'rmsprop (IMPALA, per transition)': dict(optimizer='rmsprop'),
}
LAYERS = ('conv0', 'conv1', 'conv2', 'linear', 'policy', 'value')


def weight_steps(step_over_lr) -> Dict[str, float]:
  """Layer label -> step/lr of its weights (convs numbered in order of appearance)."""
  out, convs = {}, 0
  for x in step_over_lr:
    if not x['name'].endswith('/w:0'):
      continue
    if len(x['shape']) == 4:
      out[f'conv{convs}'] = x['value']
      convs += 1
    else:
      out[x['name'].split('/')[-2]] = x['value']
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--updates', type=int, default=300)
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--learning_rate', type=float, default=6e-4)
  args = parser.parse_args()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import probes  # pylint: disable=g-import-not-at-top
  from tests.unit.pong_unrolls import random_play_unrolls  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.learning import VTraceLearner  # pylint: disable=g-import-not-at-top
  from seedacme.agents.vtrace.networks import make_network  # pylint: disable=g-import-not-at-top
  settings = dict(list(SETTINGS.items())[:2]) if args.quick else SETTINGS
  updates = 20 if args.quick else args.updates
  unrolls = random_play_unrolls()
  rows, results = [], {}
  for name, overrides in settings.items():
    config = registry.make_builder('vtrace', 'atari', batch_size=args.batch_size,
                                   learning_rate=args.learning_rate, **overrides).config
    tf.random.set_seed(0)
    network = make_network(config.core, 6, config.hidden_sizes, config.lstm_size,
                           config.torso)
    network(tf.constant(unrolls[0]['observation'][:1]), ())
    res = probes.probe(VTraceLearner(network, config, None), network, unrolls,
                       args.batch_size, updates, args.learning_rate)
    results[name] = res
    row = {'setting': name, **{k: f'{v:.2g}' for k, v in weight_steps(res['step_over_lr']).items()}}
    row['alive'] = ' '.join(f'{a:.0%}>{b:.0%}' for a, b in zip(res['alive_before'], res['alive_after']))
    row['value spread'] = res['value_spread']
    rows.append(row)
    print(f'  {name}: done', flush=True)
  print(f'\nmean |step| / lr over the last 10 of {updates} updates (batch {args.batch_size}, '
        f'lr {args.learning_rate}; load {os.getloadavg()[0]:.1f})')
  harness.print_table(rows, ['setting', *LAYERS, 'alive', 'value spread'])
  print('wrote', harness.write_json('optimizer_probe.json', {
      'machine': harness.machine(), 'updates': updates, 'batch_size': args.batch_size,
      'learning_rate': args.learning_rate, 'rows': rows, 'results': results}))


if __name__ == '__main__':
  main()
