"""A bounded V-trace learning run on an Atari game (default Pong), with its baseline.

    .venv/bin/python bench/pong_learning.py                 # up to 3 h, stops at +18
    .venv/bin/python bench/pong_learning.py --smoke         # ~2.5 minutes: does it run?
    .venv/bin/python bench/pong_learning.py --hours 1 -- --agent_config batch_size=16

1. Random-policy baseline: uniformly random actions on 16 envs of the same game (same
   preprocessing, ale-py's vector engine) until `--baseline_episodes` episodes ended.
2. The program: `run_local atari vtrace <num_actors> <envs_per_actor> --game <game>` with
   the per-env defaults of agents/registry.py and nothing else (Nature CNN,
   feed-forward, T=20, batch 8, queue 32, rewards clipped in the loss; the optimizer
   and its settings are the registry's), until the time budget or the target return
   (arguments after `--` go to run_local as they are).
3. The raw env ceiling, once the program has stopped (so the machine is quiet):
   `num_actors` processes each stepping `envs_per_actor` envs of the same game with the
   same engine and random actions, no inference and no RPC (`harness.env_ceiling`). The
   run's acting throughput is reported as a fraction of it.
4. Writes <logdir>/curve.csv and curve.png (seedacme/run/curves.py) and a JSON summary
   (frames/s, duration, returns, the baseline, the ceiling, `seed_curves`: the curve at
   fixed env-step points, which is what a published result keeps of it) to
   <logdir>/learning_summary.json and bench/results/<game>_learning_<agent>.json (or `--out`), with
   every launch of the run on its logdir (`launches`: date, commit, load before and
   after, wall time; kept in <logdir>/bench_run.json), the machine, and what the run
   ran with: `agent_config_full` (the agent's config dataclass after the registry's
   defaults and the overrides) and `env_config_full` (the training envs' options), from
   the run's saved run_config.json, else resolved from its command by the launcher's
   code (`harness.run_configs`).

`--resummarize LOGDIR` redoes steps 3-4 for a run that already ended (or was stopped),
keeping its recorded baseline and command.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from seedacme.run.accounting import EpisodeTracker  # noqa: E402
from seedacme.run import curves as curves_lib  # noqa: E402
from seedacme.run.curves import full_windows, read_progress, write_curves  # noqa: E402
from seedacme.envs.atari_vector import AtariVectorEnv  # noqa: E402

FRAMES_PER_STEP = 4
# Published random-agent Pong score (Mnih et al. 2015, Nature, Extended Data Table 2).
PUBLISHED_RANDOM = {'Pong': -20.7}


# Training averages whose first crossing is reported (env steps, run time).
MILESTONES = (-15.0, 0.0, 10.0, 18.0)
RUN_FILE = 'bench_run.json'  # in the logdir: every launch of this run by this bench


def read_launches(logdir: str) -> List[Dict[str, Any]]:
  path = os.path.join(logdir, RUN_FILE)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return json.load(f)['launches']


def record_launch(logdir: str, launch: Dict[str, Any]) -> List[Dict[str, Any]]:
  launches = read_launches(logdir) + [launch]
  with open(os.path.join(logdir, RUN_FILE), 'w') as f:
    json.dump({'launches': launches}, f, indent=1)
  return launches


def random_baseline(game: str, episodes: int, num_envs: int = 16,
                    seed: int = 12345) -> Dict[str, Any]:
  """Average return of uniformly random actions, same preprocessing as the actors."""
  env = AtariVectorEnv(game, num_envs, seed=seed)
  rng = np.random.RandomState(seed)
  returns: List[float] = []
  start = time.monotonic()
  tracker, ids = EpisodeTracker(num_envs), np.arange(num_envs)
  try:
    env.reset()
    while len(returns) < episodes:
      ts = env.step(rng.randint(env.spec.num_actions, size=num_envs))
      returns.extend(tracker.observe(ids, ts.step_type, ts.reward).returns)
  finally:
    env.close()
  returns = returns[:episodes]
  return {'episodes': len(returns), 'average_return': float(np.mean(returns)),
          'std_return': float(np.std(returns)), 'min_return': float(np.min(returns)),
          'max_return': float(np.max(returns)), 'seconds': time.monotonic() - start,
          'published_random': PUBLISHED_RANDOM.get(game)}


learner_means = harness.learner_means  # the run means a published field reports


def summarize(logdir: str, wall_s: float, returncode: int) -> Dict[str, Any]:
  """Throughput and returns of the run from its progress records and summary."""
  records = read_progress(logdir)
  summary_path = os.path.join(logdir, 'summary.json')
  summary = {}
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      summary = json.load(f)
  last = records[-1] if records else {}
  # A resumed run (same logdir) appends records whose clock starts again at 0: the
  # run's duration is the sum of its segments' last clocks.
  # Each record's run time: its segment's clock plus the segments that ended before.
  segments, run_s = [], []
  for r, nxt in zip(records, records[1:] + [None]):
    run_s.append(sum(segments) + r['elapsed_s'])
    if nxt is None or nxt['elapsed_s'] < r['elapsed_s']:
      segments.append(r['elapsed_s'])
  elapsed = (sum(segments) if len(segments) > 1
             else summary.get('elapsed_s', last.get('elapsed_s'))) or 0.0
  env_steps = summary.get('env_steps', last.get('env_steps')) or 0
  # Only averages over a full window count (after a resume the average starts over).
  full = full_windows(records)
  trained = [(r, t) for r, t, ok in zip(records, run_s, full)
             if ok and r.get('average_return') is not None]
  best = max((r for r, _ in trained), key=lambda r: r['average_return']) if trained else None
  milestones = {}
  for threshold in MILESTONES:
    hit = next(((r, t) for r, t in trained if r['average_return'] >= threshold), None)
    milestones[f'{threshold:+g}'] = None if hit is None else {
        'env_steps': hit[0]['env_steps'], 'run_s': round(hit[1], 1)}
  return {
      'returncode': returncode,
      'stopped_because': summary.get('stopped_because'),
      'wall_s': wall_s,
      'duration_s': elapsed,
      'segments_s': segments,
      'env_steps': env_steps,
      'frames': env_steps * FRAMES_PER_STEP,
      'frames_per_s': env_steps * FRAMES_PER_STEP / elapsed if elapsed else None,
      'learner_steps': summary.get('learner_steps', last.get('learner_steps')),
      'episodes': summary.get('episodes', last.get('episodes')),
      'final_average_return': summary.get('average_return', last.get('average_return')),
      'final_eval_average_return': summary.get('eval_average_return',
                                               last.get('eval_average_return')),
      'best_average_return': None if best is None else best['average_return'],
      'best_at_env_steps': None if best is None else best['env_steps'],
      'best_at_s': None if best is None else best['elapsed_s'],
      'milestones': milestones,
      # Added 2026-11-27 (issue 36: policy lag and clip fractions of a run).
      'learner_means': learner_means(records),
      'learner_means_over_steps': len({r['learner_steps'] for r in records
                                       if r.get('learner_steps')}),
  }


def run_to_end(cmd: List[str], grace_s: float = 120.0) -> int:
  """Runs `cmd` to its end. On Ctrl-C, lets it shut its program down (run_local stops
  every node on SIGINT) instead of killing it, which would orphan the nodes; the
  summary of the interrupted run is still written."""
  proc = subprocess.Popen(cmd, cwd=REPO)
  try:
    return proc.wait()
  except KeyboardInterrupt:
    print('interrupted: stopping the program', flush=True)
    proc.send_signal(signal.SIGINT)
    try:
      return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      return proc.wait()


def measure_ceiling(program: Dict[str, Any], seconds: float) -> Dict[str, Any]:
  """Frames/s of the actors' engine alone: random actions, no inference, no RPC.

  `program`: the run's game, num_actors, envs_per_actor and env_engine.
  """
  game, num_actors, envs_per_actor, engine = (program['game'], program['num_actors'],
                                              program['envs_per_actor'],
                                              program['env_engine'])
  print(f'env ceiling: {num_actors} processes x {envs_per_actor} envs of {game} '
        f'({engine}), random actions, {seconds:.0f}s', flush=True)
  steps_per_s = harness.env_ceiling('atari', num_actors, envs_per_actor, seconds=seconds,
                                    game=game, engine=engine)
  print(f'  {steps_per_s * FRAMES_PER_STEP:,.0f} frames/s', flush=True)
  return {'processes': num_actors, 'envs_per_process': envs_per_actor, 'engine': engine,
          'env_steps_per_s': steps_per_s, 'frames_per_s': steps_per_s * FRAMES_PER_STEP}


def _agent_suffix(agent: str) -> str:
  """'' for V-trace (the published file's name before other agents), else '_<agent>'."""
  return '' if agent == 'vtrace' else f'_{agent}'


def seed_curves(result: Dict[str, Any], records: List[Dict[str, Any]]) -> Dict[str, Any]:
  """The run's published curve: its averages at fixed env-step points (the JSON holds
  it; the logdir's curve.csv keeps every record)."""
  every = curves_lib.curve_step(result.get('env_steps') or 1)
  argv = result['command'].split()
  seed = int(argv[argv.index('--seed') + 1]) if '--seed' in argv else None
  return curves_lib.seed_curves(every, [{
      'name': result.get('out') or os.path.basename(result['logdir'].rstrip('/')),
      'task': result['game'], 'agent': result.get('agent', 'vtrace'), 'seed': seed,
      **curves_lib.published_curve(records, every)}])


def finish(result: Dict[str, Any], smoke: bool) -> int:
  """Adds the curves and the ceiling ratio, writes the JSONs and prints the outcome."""
  logdir = result['logdir']
  try:
    result['curves'] = write_curves(
        logdir, title=f"{result.get('agent', 'vtrace')} on {result['game']}")
  except Exception as e:  # pylint: disable=broad-except
    result['curves'] = f'could not write the curves: {e}'
  result['seed_curves'] = seed_curves(result, read_progress(logdir))
  fps, ceiling = result['frames_per_s'], result['env_ceiling']['frames_per_s']
  result['fraction_of_ceiling'] = fps / ceiling if fps and ceiling else None
  for path in (os.path.join(logdir, 'learning_summary.json'),
               os.path.join(REPO, 'bench', 'results', _results_name(result, smoke))):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(harness.dumps(result) + '\n')
  baseline = result['random_baseline']
  fraction = result['fraction_of_ceiling']
  print(f"done: {result['stopped_because']}; {result['duration_s']:.0f}s, "
        f"{result['frames']:,} frames ({'-' if fps is None else f'{fps:,.0f}'}/s, "
        f"{'-' if fraction is None else f'{100 * fraction:.0f}'} % of the "
        f"{ceiling:,.0f} frames/s env ceiling), final average return "
        f"{result['final_average_return']} (random {baseline['average_return']:.2f}); "
        f"summary {path}", flush=True)
  return result['returncode']


def _results_name(result: Dict[str, Any], smoke: bool) -> str:
  """bench/results/<name>: `--out` if the run was given one, else game and agent."""
  if smoke:
    return 'pong_learning_smoke.json'
  if result.get('out'):
    return f"{result['out']}.json"
  return (f"{result['game'].lower()}_learning"
          f"{_agent_suffix(result.get('agent', 'vtrace'))}.json")


def _program_of(result: Dict[str, Any]) -> Dict[str, Any]:
  """The run's game, actors, envs per actor and engine, as recorded in its summary.

  Summaries written before these were stored as fields (the published one) only have
  the command line, which run_local's own parser reads back.
  """
  if 'program' in result:
    return result['program']
  from seedacme.launchers.local import parse_args  # pylint: disable=import-outside-toplevel
  args = parse_args(_run_local_args(result['command']))
  return {'game': args.game, 'num_actors': args.num_actors,
          'envs_per_actor': args.envs_per_actor, 'env_engine': args.env_engine}


def _run_local_args(command: str) -> List[str]:
  """The `run_local` arguments of a recorded command line."""
  argv = command.split()
  return argv[argv.index('seedacme.launchers.local') + 1:]


def resummarize(logdir: str, ceiling_seconds: float, out: str | None = None) -> int:
  """Recomputes the summary, the curves and the ceiling of a run that has ended."""
  with open(os.path.join(logdir, 'learning_summary.json')) as f:
    old = json.load(f)
  program = _program_of(old)
  # The logdir given, not the recorded one: the run may have been moved or copied.
  result = {**old, 'logdir': logdir, 'program': program, 'machine': harness.machine(),
            'launches': read_launches(logdir) or old.get('launches', []),
            **({'out': out} if out else {}),
            **harness.run_configs(_run_local_args(old['command']), logdir),
            **summarize(logdir, old['wall_s'], old['returncode'])}
  result['env_ceiling'] = measure_ceiling(program, ceiling_seconds)
  return finish(result, smoke=False)


def main() -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      epilog='Arguments after -- are passed to run_local unchanged.')
  parser.add_argument('--game', default='Pong')
  parser.add_argument('--agent', default='vtrace', help="the agent ('vtrace', 'ppo', ...)")
  parser.add_argument('--hours', type=float, default=3.0, help='time budget of the run')
  parser.add_argument('--target_return', type=float, default=18.0,
                      help='stop once the training average (last 100 episodes) reaches this')
  parser.add_argument('--num_actors', type=int, default=2)
  parser.add_argument('--envs_per_actor', type=int, default=16)
  parser.add_argument('--env_engine', default='vector_sync',
                      choices=('python', 'vector_sync', 'vector_async'))
  parser.add_argument('--eval_interval_s', type=float, default=300.0,
                      help='greedy evaluation every this many seconds')
  parser.add_argument('--eval_episodes', type=int, default=4)
  parser.add_argument('--baseline_episodes', type=int, default=32)
  parser.add_argument('--logdir', default=None)
  parser.add_argument('--out', default=None,
                      help='results name (bench/results/<out>.json; default '
                      '<game>_learning_<agent>): a probe with other settings keeps '
                      'its own file instead of overwriting the main run\'s')
  parser.add_argument('--ceiling_seconds', type=float, default=20.0,
                      help='how long to measure the raw env ceiling')
  parser.add_argument('--smoke', action='store_true',
                      help='90 s budget and a small baseline: checks that it all runs')
  parser.add_argument('--resummarize', metavar='LOGDIR', default=None,
                      help='only redo the ceiling, curves and summary of an ended run')
  argv, passthrough = harness.split_passthrough(sys.argv[1:])
  args = parser.parse_args(argv)
  harness.interrupt_on_stop_signals()
  if args.resummarize:
    return resummarize(os.path.abspath(args.resummarize), args.ceiling_seconds, args.out)
  if args.smoke:
    args.hours, args.baseline_episodes, args.eval_interval_s = 90 / 3600, 16, 30.0
    args.ceiling_seconds = 5.0
  logdir = os.path.abspath(args.logdir or os.path.join(
      REPO, 'runs', f'{args.game.lower()}_learning{_agent_suffix(args.agent)}_'
      f'{datetime.datetime.now():%Y%m%d_%H%M%S}'))

  print(f'baseline: random actions on {args.game} until {args.baseline_episodes} episodes '
        'ended', flush=True)
  baseline = random_baseline(args.game, args.baseline_episodes)
  print(f"  average return {baseline['average_return']:.2f} +- {baseline['std_return']:.2f} "
        f"({baseline['episodes']} episodes, {baseline['seconds']:.0f}s; published "
        f"random {baseline['published_random']})", flush=True)

  cmd = [sys.executable, '-m', 'seedacme.launchers.local', 'atari', args.agent,
         str(args.num_actors), str(args.envs_per_actor), '--game', args.game,
         '--env_engine', args.env_engine, '--max_seconds', str(args.hours * 3600),
         '--eval_interval_s', str(args.eval_interval_s),
         '--eval_episodes', str(args.eval_episodes), '--logdir', logdir]
  if args.target_return is not None and not args.smoke:
    cmd += ['--target_return', str(args.target_return)]
  cmd += passthrough
  print('run: ' + ' '.join(cmd[1:]), flush=True)
  os.makedirs(logdir, exist_ok=True)
  launch = {'date': time.strftime('%Y-%m-%d %H:%M'), **harness.commit(),
            'load_1m_before': os.getloadavg()[0]}
  start = time.monotonic()
  returncode = run_to_end(cmd)
  wall_s = time.monotonic() - start
  launches = record_launch(logdir, {**launch, 'wall_s': wall_s, 'returncode': returncode,
                                    'load_1m_after': os.getloadavg()[0]})

  program = {'game': args.game, 'num_actors': args.num_actors,
             'envs_per_actor': args.envs_per_actor, 'env_engine': args.env_engine}
  result = {'game': args.game, 'agent': args.agent, 'command': ' '.join(cmd[1:]), 'logdir': logdir,
            'program': program, 'random_baseline': baseline, 'machine': harness.machine(),
            'launches': launches, **({'out': args.out} if args.out else {}),
            **harness.run_configs(cmd[3:], logdir),
            **summarize(logdir, wall_s, returncode)}
  result['env_ceiling'] = measure_ceiling(program, args.ceiling_seconds)
  return finish(result, args.smoke)


if __name__ == '__main__':
  sys.exit(main())
