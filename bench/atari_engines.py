"""How fast can an actor step Atari? The three env engines, measured.

    .venv/bin/python bench/atari_engines.py            # ~15 minutes
    .venv/bin/python bench/atari_engines.py --program_mode acting_only --out ...
    .venv/bin/python bench/atari_engines.py --quick    # < 2 minutes, asserts no timings

Three parts, all Pong, frames/s = env steps x 4 (action repeat):

1. ceiling: ale-py's `AtariVectorEnv` alone, random actions, 16 envs, batch 8, 2 threads
   (the EnvPool loop: recv a batch, send its actions) -- the setting of
   shared/notes/atari-envs.md.
2. actor: the real `EnvActor` loop (seedacme/actor/env_actor.py) with each engine ('python',
   'vector_sync', 'vector_async') and K envs, against a fake in-process inference server
   that answers random actions either at once (zero latency) or from another thread
   after a fixed delay (a simulated server round trip). No TensorFlow, no Courier.
3. program: `run_local atari vtrace 2 --env_engine X` for each engine (real Courier,
   central inference, learner, Reverb), env steps/s over the last part of the run from
   <logdir>/progress.jsonl.

Prints a table per part and writes bench/results/atari_engines[_quick].json.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from concurrent import futures
from typing import Any, Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from seedacme import envs  # noqa: E402
from seedacme.actor.env_actor import EnvActor  # noqa: E402
from seedacme.launchers import process  # noqa: E402
from seedacme.run.logdir import read_progress  # noqa: E402

FRAMES_PER_STEP = 4
ENGINES = ('python', 'vector_sync', 'vector_async')


def load() -> float:
  """1-minute load average (other work on the machine skews every number)."""
  return os.getloadavg()[0]


def ceiling(seconds: float, num_envs: int = 16, batch_size: int = 8,
            num_threads: int = 2) -> Dict[str, Any]:
  """Raw `AtariVectorEnv` frames/s with random actions (no Python per env)."""
  import ale_py  # pylint: disable=g-import-not-at-top
  env = ale_py.AtariVectorEnv('pong', num_envs, batch_size=batch_size,
                              num_threads=num_threads, reward_clipping=False,
                              use_fire_reset=False)
  rng = np.random.RandomState(0)
  actions = rng.randint(6, size=(256, batch_size)).astype(np.int32)
  env.reset(seed=0)
  steps, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    env.send(actions[steps % 256])
    env.recv()
    steps += 1
  elapsed = time.perf_counter() - start
  env.close()
  return {'num_envs': num_envs, 'batch_size': batch_size, 'num_threads': num_threads,
          'frames_per_s': steps * batch_size * FRAMES_PER_STEP / elapsed}


class FakeServer:
  """`client.futures.step(request)` answering random actions, at once or after a delay.

  With a delay, one thread answers every request `delay_s` after it arrived (the
  actor's Python thread is free meanwhile, as with a real Courier future); it sleeps
  rather than spins, so it costs the actor's cores nothing, and overshoots a little:
  `latencies_s` has the real submit -> answer times.
  """

  def __init__(self, num_actions: int, delay_s: float):
    self.futures = self
    self._num_actions = num_actions
    self._delay_s = delay_s
    self._rng = np.random.RandomState(0)
    self._pool = futures.ThreadPoolExecutor(1) if delay_s > 0 else None
    self.latencies_s: List[float] = []

  def _reply(self, request) -> dict:
    n = request['ids'].shape[1]
    return {'action': self._rng.randint(self._num_actions, size=n).astype(np.int32)}

  def step(self, request) -> futures.Future:
    if self._pool is None:
      future = futures.Future()
      future.set_result(self._reply(request))
      return future
    sent = time.perf_counter()

    def answer():
      left = sent + self._delay_s - time.perf_counter()
      if left > 0:
        time.sleep(left)
      reply = self._reply(request)
      self.latencies_s.append(time.perf_counter() - sent)
      return reply

    return self._pool.submit(answer)

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown()


def actor_rate(engine: str, num_envs: int, delay_s: float, seconds: float,
               num_threads: int = 0) -> Dict[str, Any]:
  """Env steps/s and CPU per env step of one `EnvActor` with `engine` and a fake server.

  CPU time is this process's (every thread: the actor loop, ale-py's workers, the fake
  server's thread), so it shows what an engine costs even when other work on the
  machine slows the wall clock.
  """
  factory = envs.make_factory('atari', engine=engine, num_threads=num_threads)
  server = FakeServer(6, delay_s)
  stop = threading.Event()
  actor = EnvActor(server, factory, actor_id=0, num_envs=num_envs, first_env_id=0,
                   seed=0, stop_event=stop, log_interval_s=1e9)
  warmup = min(1.0, seconds / 4)
  marks = {}

  def mark():
    return time.perf_counter(), time.process_time(), actor.env_steps, actor.steps, load()

  def measure():
    # The window starts `warmup` after the first answered call: resetting K envs (32
    # gymnasium envs take seconds on a busy machine) is not stepping.
    while actor.env_steps == 0:
      if stop.wait(0.01):
        return
    if stop.wait(warmup):
      return
    marks['start'] = mark()
    stop.wait(seconds)
    marks['end'] = mark()
    stop.set()

  timer = threading.Thread(target=measure, daemon=True)
  timer.start()
  try:
    actor.run()
  finally:
    stop.set()
    timer.join()
    server.close()
  (t0, c0, s0, n0, _), (t1, c1, s1, n1, load1) = marks['start'], marks['end']
  steps_per_s = (s1 - s0) / (t1 - t0)
  latencies = server.latencies_s[len(server.latencies_s) // 4:]
  return {'engine': engine, 'num_envs': num_envs, 'delay_ms': delay_s * 1e3,
          'num_threads': num_threads, 'env_steps_per_s': steps_per_s,
          'frames_per_s': steps_per_s * FRAMES_PER_STEP,
          'calls_per_s': (n1 - n0) / (t1 - t0),
          'cpu_us_per_env_step': (c1 - c0) / max(1, s1 - s0) * 1e6,
          'cores_busy': (c1 - c0) / (t1 - t0),
          'server_latency_ms': float(np.mean(latencies)) * 1e3 if latencies else 0.0,
          'load': load1}


def program_rate(engine: str, max_seconds: float, skip_s: float, workdir: str,
                 extra: List[str]) -> Dict[str, Any]:
  """env steps/s of `run_local atari vtrace 2 --env_engine engine` after `skip_s`."""
  logdir = os.path.join(workdir, f'atari_{engine}')
  start = time.monotonic()
  proc = process.run(['atari', 'vtrace', '2', '--env_engine', engine, '--max_seconds',
                      str(max_seconds), '--checkpoint_interval_s', '0', *extra], logdir,
                     timeout_s=max_seconds + 240, cwd=REPO)
  wall = time.monotonic() - start
  records = read_progress(logdir)
  window = [r for r in records if r['elapsed_s'] >= skip_s]
  rate = None
  if len(window) >= 2:
    a, b = window[0], window[-1]
    rate = (b['env_steps'] - a['env_steps']) / (b['elapsed_s'] - a['elapsed_s'])
  last = records[-1] if records else {}
  return {'engine': engine, 'returncode': proc.returncode, 'wall_s': wall,
          'window_s': [window[0]['elapsed_s'], window[-1]['elapsed_s']] if window else None,
          'env_steps_per_s': rate,
          'frames_per_s': None if rate is None else rate * FRAMES_PER_STEP,
          'learner_steps_per_s': last.get('learner_steps_per_s'),
          'batch_fill': last.get('batch_fill'),
          'latency_ms': last.get('latency_ms'),
          'output_tail': proc.stdout.strip().splitlines()[-3:] + proc.stderr.strip().splitlines()[-3:]}


def _fmt(x, spec=',.0f'):
  return '-' if x is None else format(x, spec)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='short windows, K=8 only, one short program run (< 2 minutes)')
  parser.add_argument('--seconds', type=float, default=4.0, help='window per actor config')
  parser.add_argument('--delays_ms', default='0,1,4',
                      help='simulated server round trips (comma-separated)')
  parser.add_argument('--num_envs', default='8,16,32')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--num_threads', type=int, default=0,
                      help="ale-py worker threads per actor engine (0: one per core)")
  parser.add_argument('--program_seconds', type=float, default=80.0,
                      help='run_local --max_seconds per engine (0: skip the programs)')
  parser.add_argument('--program_skip_s', type=float, default=20.0,
                      help='measure program throughput from this many seconds on')
  parser.add_argument('--program_mode', choices=('train', 'acting_only'), default='train',
                      help='train: the full program; acting_only: run_local --acting_only '
                      '(central inference without learner and trajectories)')
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  if args.quick:
    args.seconds, args.delays_ms, args.num_envs, args.repeats = 1.0, '0,2', '8', 1
    args.program_seconds, args.program_skip_s = 20.0, 5.0
  delays = [float(d) / 1e3 for d in args.delays_ms.split(',')]
  sizes = [int(k) for k in args.num_envs.split(',')]
  name = 'atari_engines' + ('_quick' if args.quick else '') + (
      '_acting_only' if args.program_mode == 'acting_only' else '')
  out = args.out or os.path.join(REPO, 'bench', 'results', name + '.json')
  results: Dict[str, Any] = {
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  'load_at_start': load()},
      'quick': args.quick}

  print(f'ceiling: ale-py AtariVectorEnv, Pong, random actions (load {load():.1f})')
  ceil = ceiling(2.0 if args.quick else 10.0)
  results['ceiling'] = ceil
  print(f"  16 envs, batch 8, 2 threads: {ceil['frames_per_s']:,.0f} frames/s")

  print(f'\nactor: EnvActor + fake server; median of {args.repeats} interleaved runs of '
        f'{args.seconds:g}s (load {load():.1f})', flush=True)
  rows = []
  for k in sizes:
    for delay in delays:
      for _ in range(args.repeats):  # engines interleaved: load changes hit all alike
        for engine in ENGINES:
          rows.append(actor_rate(engine, k, delay, args.seconds, args.num_threads))
  summary = []
  for k in sizes:
    for engine in ENGINES:
      for delay in delays:
        runs = [r for r in rows if (r['engine'], r['num_envs'], r['delay_ms']) ==
                (engine, k, delay * 1e3)]
        summary.append({
            'engine': engine, 'num_envs': k, 'delay_ms': delay * 1e3,
            'frames_per_s': float(np.median([r['frames_per_s'] for r in runs])),
            'cpu_us_per_env_step': float(np.median([r['cpu_us_per_env_step']
                                                    for r in runs])),
            'server_latency_ms': float(np.median([r['server_latency_ms'] for r in runs])),
            'load': float(np.median([r['load'] for r in runs]))})
  for title, key, spec in (('frames/s', 'frames_per_s', ',.0f'),
                           ('CPU us per env step (all threads)', 'cpu_us_per_env_step',
                            ',.0f')):
    print(f'\n{title}')
    print(f"{'engine':<14}{'K':>4}" + ''.join(f"{f'{d * 1e3:g} ms':>12}" for d in delays))
    for k in sizes:
      for engine in ENGINES:
        line = f'{engine:<14}{k:>4}'
        for delay in delays:
          r = next(r for r in summary if (r['engine'], r['num_envs'], r['delay_ms']) ==
                   (engine, k, delay * 1e3))
          line += f'{format(r[key], spec):>12}'
        print(line)
  results['actor'] = summary
  results['actor_runs'] = rows

  programs = []
  if args.program_seconds:
    engines = ('vector_async',) if args.quick else ENGINES
    print(f'\nprogram ({args.program_mode}): run_local atari vtrace 2 (16 envs/actor), '
          f'env steps/s after '
          f'{args.program_skip_s:.0f}s of {args.program_seconds:.0f}s')
    with tempfile.TemporaryDirectory(prefix='seedacme_atari_engines_') as workdir:
      for engine in engines:
        extra = ['--acting_only'] if args.program_mode == 'acting_only' else []
        r = program_rate(engine, args.program_seconds, args.program_skip_s, workdir, extra)
        r['mode'] = args.program_mode
        r['load'] = load()
        programs.append(r)
        print(f"  {engine:<14} env steps/s {_fmt(r['env_steps_per_s'])} "
              f"(frames/s {_fmt(r['frames_per_s'])}), learner steps/s "
              f"{_fmt(r['learner_steps_per_s'], '.2f')}, batch fill "
              f"{_fmt(r['batch_fill'], '.0%')}, rc {r['returncode']}, "
              f"load {r['load']:.1f}", flush=True)
  results['program'] = programs
  results['machine']['load_at_end'] = load()

  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out, 'w') as f:
    json.dump(results, f, indent=1)
  print(f'\nwrote {out}')

  # Sanity (never timings): every configuration stepped, every program ran and reported.
  assert ceil['frames_per_s'] > 0
  assert all(r['env_steps_per_s'] > 0 for r in rows), rows
  for r in programs:
    assert r['returncode'] == 0 and r['env_steps_per_s'], r
  return 0


if __name__ == '__main__':
  sys.exit(main())
