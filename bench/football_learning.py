"""Google Research Football: V-trace learning evidence, and 11 vs 11 throughput.

    .venv/bin/python bench/football_learning.py                 # learning, <= 15 min
    .venv/bin/python bench/football_learning.py --smoke         # ~2 minutes: does it run?
    .venv/bin/python bench/football_learning.py --throughput    # 11 vs 11, 4 actors
    .venv/bin/python bench/football_learning.py --throughput -- --acting_only

Learning (default), on `academy_empty_goal_close`:

1. Random policy: uniformly random actions on 16 envs of the scenario until
   `--eval_episodes` episodes ended; its raw scoring rate (episodes with a goal) and
   average score.
2. The program: `run_local football vtrace <num_actors> <envs_per_actor>` with the
   representation, rewards and agent settings below (arguments after `--` go to
   run_local as they are), until the time budget or the target scoring rate.
3. The learned policy, from the run's exported SavedModel, on fresh envs: its raw
   scoring rate with sampled actions (as it trains) and greedy actions. Raw means goals
   only: with `--rewards scoring,checkpoints` the program's returns are shaped, and the
   scoring rates come from `FootballEnv.episode_score`, never from the reward.
4. Writes <logdir>/curve.csv and curve.png (seedacme/run/curves.py; with `scoring` rewards
   the training return IS the scoring rate), and a JSON summary to
   <logdir>/learning_summary.json and bench/results/football_learning[_smoke].json;
   prints a table.

Throughput (`--throughput`): `11_vs_11_easy_stochastic`, 4 actors, SEED's stacked SMM and
ResNet torso, training as usual for `--seconds`; reports env steps/s and learner steps/s
of the program (steady state) next to the env ceiling (the same envs stepped with random
actions in 4 processes, no inference), to bench/results/football_throughput.json.
"""

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

import harness
from seedacme import envs
from seedacme.run import curves as curves_lib
from seedacme.run.curves import write_curves

REPO = harness.REPO

LEARNING_SCENARIO = 'academy_empty_goal_close'
THROUGHPUT_SCENARIO = '11_vs_11_easy_stochastic'
# A small MLP on the 115 floats learns this scenario in minutes on 2 CPU cores; SEED's
# ResNet on the stacked SMM (run_local's default for football) needs far more compute.
LEARNING_AGENT = ['torso=mlp', 'hidden_sizes=(128, 128)', 'unroll_length=16',
                  'batch_size=8', 'discount=0.99', 'learning_rate=6e-4',
                  'entropy_cost=0.01']

Policy = Callable[[np.ndarray], np.ndarray]


def evaluate(policy: Policy | None, episodes: int, scenario: str, representation: str,
             rewards: str, num_envs: int = 16, seed: int = 12345) -> Dict[str, Any]:
  """Raw scoring rate of `policy` (None: uniformly random actions) over `episodes`."""
  factory = envs.make_factory('football', scenario=scenario,
                              representation=representation, rewards=rewards)
  games = [factory(seed + i) for i in range(num_envs)]
  rng = np.random.RandomState(seed)
  scores: List[float] = []  # raw: goals for minus against, from the env
  returns: List[float] = []  # what the learner sees (shaped with checkpoints)
  lengths: List[int] = []
  running = np.zeros(num_envs)
  steps = np.zeros(num_envs, np.int64)
  start = time.monotonic()
  try:
    observations = np.stack([g.reset().observation for g in games])
    while len(scores) < episodes:
      if policy is None:
        actions = rng.randint(games[0].action_spec().num_values, size=num_envs)
      else:
        actions = policy(observations)
      for i, game in enumerate(games):
        ts = game.step(actions[i])
        running[i] += ts.reward
        steps[i] += 1
        if ts.last():
          scores.append(game.episode_score)
          returns.append(running[i])
          lengths.append(int(steps[i]))
          running[i], steps[i] = 0.0, 0
          ts = game.reset()
        observations[i] = ts.observation
  finally:
    for game in games:
      game.close()
  scores, returns, lengths = scores[:episodes], returns[:episodes], lengths[:episodes]
  return {'episodes': len(scores),
          'scoring_rate': float(np.mean([s > 0 for s in scores])),
          'average_score': float(np.mean(scores)),
          'average_return': float(np.mean(returns)),
          'average_length': float(np.mean(lengths)),
          'seconds': time.monotonic() - start}


def saved_policy(path: str, greedy: bool, seed: int = 0) -> Policy:
  """The exported policy (`<logdir>/saved_model`) as `observations -> actions`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model = tf.saved_model.load(path)
  rng = np.random.RandomState(seed)
  state: Dict[int, Any] = {}

  def act(observations: np.ndarray) -> np.ndarray:
    n = len(observations)
    if n not in state:
      state[n] = model.initial_state(tf.constant(n, tf.int32))
    (logits, _), _ = model.step(tf.constant(observations), state[n])  # feed-forward
    logits = logits.numpy().astype(np.float64)
    if greedy:
      return logits.argmax(-1)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p])

  return act


def _show(name: str, r: Dict[str, Any]) -> Dict[str, Any]:
  return {'policy': name, 'episodes': r['episodes'], 'scoring rate': r['scoring_rate'],
          'avg score': r['average_score'], 'avg return': r['average_return'],
          'avg length': r['average_length']}


def learning(args: argparse.Namespace, passthrough: List[str]) -> int:
  workdir = os.path.abspath(args.logdir or os.path.join(
      REPO, 'runs', f'football_learning_{datetime.datetime.now():%Y%m%d_%H%M%S}'))
  env_args = dict(scenario=LEARNING_SCENARIO, representation=args.representation,
                  rewards=args.rewards)
  print(f'random policy on {LEARNING_SCENARIO} until {args.eval_episodes} episodes ended',
        flush=True)
  random = evaluate(None, args.eval_episodes, **env_args)
  print(f"  scoring rate {random['scoring_rate']:.3f} ({random['seconds']:.0f}s)", flush=True)

  cmd = ['football', 'vtrace', str(args.num_actors), str(args.envs_per_actor),
         '--scenario', LEARNING_SCENARIO,
         '--env_config', f'representation={args.representation}',
         '--env_config', f'rewards={args.rewards}',
         '--max_seconds', str(args.minutes * 60), '--seed', str(args.seed)]
  for item in LEARNING_AGENT if args.representation == 'simple115v2' else []:
    cmd += ['--agent_config', item]
  if args.rewards == 'scoring' and args.target_rate:
    cmd += ['--target_return', str(args.target_rate)]  # return == goals per episode
  cmd += passthrough
  print('run: run_local ' + ' '.join(cmd), flush=True)
  os.makedirs(workdir, exist_ok=True)
  run = harness.ProgramRun(cmd, 'football_learning', workdir=workdir)
  logdir = run.logdir  # <workdir>/logdir
  outcome = run.run(timeout_s=args.minutes * 60 + 300)
  summary = outcome['summary']

  learned = {}
  model = os.path.join(logdir, 'saved_model')
  if os.path.isdir(model):
    for mode in ('sampled', 'greedy'):
      print(f'learned policy ({mode} actions) until {args.eval_episodes} episodes ended',
            flush=True)
      learned[mode] = evaluate(saved_policy(model, greedy=mode == 'greedy'),
                               args.eval_episodes, **env_args)
  curves = write_curves(logdir, title=f'V-trace on {LEARNING_SCENARIO} '
                        f'({args.representation}, {args.rewards} rewards)')
  result = {
      'scenario': LEARNING_SCENARIO, 'representation': args.representation,
      'rewards': args.rewards, 'command': 'run_local ' + ' '.join(cmd), 'logdir': logdir,
      'machine': harness.machine(), 'exit_code': outcome['exit_code'],
      'stopped_because': summary.get('stopped_because'),
      'duration_s': summary.get('elapsed_s'), 'wall_s': outcome['wall_s'],
      'env_steps': summary.get('env_steps'), 'learner_steps': summary.get('learner_steps'),
      'episodes': summary.get('episodes'),
      'env_steps_per_s': run.steady_rate('env_steps'),
      'learner_steps_per_s': run.steady_rate('learner_steps'),
      'final_average_return': summary.get('average_return'),
      'final_eval_average_return': summary.get('eval_average_return'),
      'curve': [{k: r.get(k) for k in ('elapsed_s', 'env_steps', 'average_return',
                                        'eval_average_return')} for r in run.records],
      'random_policy': random, 'learned_policy': learned, 'curves': curves,
      'seed_curves': curves_lib.seed_curves(every := curves_lib.curve_step(
          summary.get('env_steps') or 1), [{
              'name': LEARNING_SCENARIO, 'task': LEARNING_SCENARIO, 'agent': 'vtrace',
              'seed': 0, **curves_lib.published_curve(run.records, every)}]),
      'leftovers': outcome['leftovers']}
  name = 'football_learning_smoke.json' if args.smoke else 'football_learning.json'
  with open(os.path.join(logdir, 'learning_summary.json'), 'w') as f:
    json.dump(result, f, indent=1)
  path = harness.write_json(name, result)

  print()
  harness.print_table([_show('random', random)] +
                      [_show(f'learned ({m})', r) for m, r in learned.items()],
                      ['policy', 'episodes', 'scoring rate', 'avg score', 'avg return',
                       'avg length'])
  rate = result['env_steps_per_s']
  print(f"\nrun: {result['stopped_because']} after {result['duration_s'] or 0:.0f}s; "
        f"{result['env_steps'] or 0:,} env steps ({rate:,.0f}/s), "
        f"{result['learner_steps']} learner steps; curve {curves['png']}; summary {path}")
  return 0 if outcome['exit_code'] == 0 and learned else 1


def throughput(args: argparse.Namespace, passthrough: List[str]) -> int:
  env_args = dict(scenario=THROUGHPUT_SCENARIO, representation='extracted')
  print(f'env ceiling: {args.num_actors} processes x {args.envs_per_actor} envs of '
        f'{THROUGHPUT_SCENARIO}, random actions, no inference', flush=True)
  ceiling = harness.env_ceiling('football', args.num_actors, args.envs_per_actor,
                                seconds=30.0, **env_args)
  print(f'  {ceiling:,.0f} env steps/s', flush=True)
  cmd = ['football', 'vtrace', str(args.num_actors), str(args.envs_per_actor),
         '--scenario', THROUGHPUT_SCENARIO, '--max_seconds', str(args.seconds),
         *passthrough]
  print('run: run_local ' + ' '.join(cmd), flush=True)
  run = harness.ProgramRun(cmd, 'football_throughput')
  outcome = run.run(timeout_s=args.seconds + 300)
  summary = outcome['summary']
  result = {
      'scenario': THROUGHPUT_SCENARIO, 'representation': 'extracted', 'torso': 'football',
      'command': 'run_local ' + ' '.join(cmd), 'machine': harness.machine(),
      'exit_code': outcome['exit_code'], 'stopped_because': summary.get('stopped_because'),
      'env_ceiling_steps_per_s': ceiling,
      'env_steps_per_s': run.steady_rate('env_steps', skip_s=20.0),
      'learner_steps_per_s': run.steady_rate('learner_steps', skip_s=20.0),
      'env_steps': summary.get('env_steps'), 'learner_steps': summary.get('learner_steps'),
      'episodes': summary.get('episodes'), 'duration_s': summary.get('elapsed_s'),
      'first_env_step_s': run.first_env_step_s,
      'first_learner_step_s': run.first_learner_step_s,
      'peak_rss_mb': {'actor': run.node_rss('actor'), 'learner': run.node_rss('learner')},
      'latency_ms': summary.get('latency_ms'), 'batch_fill': summary.get('batch_fill'),
      'leftovers': outcome['leftovers'], 'logdir': run.logdir}
  acting_only = '--acting_only' in passthrough  # run_local: no learner, no trajectories
  path = harness.write_json('football_throughput_acting_only.json' if acting_only
                            else 'football_throughput.json', result)
  print()
  harness.print_table([result], ['env_ceiling_steps_per_s', 'env_steps_per_s',
                                 'learner_steps_per_s', 'env_steps', 'learner_steps',
                                 'duration_s'])
  print(f"peak RSS (MB): actor {result['peak_rss_mb']['actor']:.0f}, learner "
        f"{result['peak_rss_mb']['learner']:.0f}; summary {path}")
  return outcome['exit_code']


def main() -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      epilog='Arguments after -- are passed to run_local unchanged.')
  parser.add_argument('--throughput', action='store_true',
                      help=f'{THROUGHPUT_SCENARIO} throughput instead of learning')
  parser.add_argument('--minutes', type=float, default=15.0,
                      help='learning: time budget of the run')
  parser.add_argument('--seconds', type=float, default=180.0,
                      help='throughput: time budget of the run')
  parser.add_argument('--representation', default='simple115v2',
                      choices=('simple115v2', 'extracted'),
                      help="learning: observations (extracted: run_local's default "
                      "SMM + SEED ResNet)")
  parser.add_argument('--rewards', default='scoring',
                      choices=('scoring', 'scoring,checkpoints'))
  parser.add_argument('--target_rate', type=float, default=0.95,
                      help='learning with scoring rewards: stop once the training '
                      'scoring rate (last 100 episodes) reaches this (0: never)')
  parser.add_argument('--num_actors', type=int, default=None,
                      help='default: 2 (learning), 4 (throughput)')
  parser.add_argument('--envs_per_actor', type=int, default=16)
  parser.add_argument('--eval_episodes', type=int, default=200,
                      help='episodes per scoring-rate measurement')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--logdir', default=None,
                      help='learning: where the run goes (the program: <logdir>/logdir)')
  parser.add_argument('--smoke', action='store_true',
                      help='learning: 60 s budget and 32 evaluation episodes')
  argv, passthrough = harness.split_passthrough(sys.argv[1:])
  args = parser.parse_args(argv)
  if args.num_actors is None:
    args.num_actors = 4 if args.throughput else 2
  if args.smoke:
    args.minutes, args.eval_episodes = 1.0, 32
  try:
    import gfootball.env  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    print('gfootball is not installed: run scripts/setup_football', file=sys.stderr)
    return 2
  return throughput(args, passthrough) if args.throughput else learning(args, passthrough)


if __name__ == '__main__':
  sys.exit(main())
