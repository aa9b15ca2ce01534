"""The inference service against its transport ceiling: SEED server vs a Courier echo.

    .venv/bin/python bench/inference_service.py           # Catch MLP and Atari IMPALA CNN
    .venv/bin/python bench/inference_service.py --quick   # Catch only, short (CI smoke)

A server process serves `step(request)` over Courier; client processes (one per
simulated actor) send requests of K envs in a closed loop with no env stepping, so the
service alone is measured. Servers, all with identical payloads both ways:

    echo      returns K zero actions at once: Courier transport + serialization only
    batcher   seedacme's InferenceServer (validation, cross-actor batching, episode
              tracking) with a policy that does no work
    seed      the same InferenceServer with the V-trace policy network: one compiled
              batch step per batch, recurrent state on the device

`batcher` and `seed` also run with their requests through shared memory
(`transport` shm: `seedacme.wire.shm`, what same-host actors use by default) beside
Courier; echo stays the Courier floor the `of_echo` column divides by.

`batcher` and `seed` run with the program's default batching (`ProgramConfig`: the
policy runs whatever is queued as soon as it is free); `--batching` adds rows for other
settings of the minimum batch, `lockstep` (wait for every client's request, 2 ms
timeout) and `half` (half of the clients' envs). Per server: requests/s, env steps/s,
client-side p50/p99 latency, mean batch fill (envs per batch / envs that could be in
one); each as a fraction of echo. Prints a table, writes
bench/results/inference_service.json.
"""

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any, Dict

import numpy as np

from harness import machine, print_table, write_json

ENV_SHAPES = {'catch': ((10, 5), 'float32', 3), 'atari': ((84, 84, 4), 'uint8', 6)}


BATCHING = ('free', 'lockstep', 'half')


def _min_batch_envs(batching: str, num_envs: int) -> int | None:
  """The server's `max_batch_envs` for a batching setting (None: the program default)."""
  return {'free': None, 'lockstep': num_envs, 'half': max(1, num_envs // 2)}[batching]


XLA_SINGLE_THREAD = '--xla_cpu_multi_thread_eigen=false'


def _serve(kind: str, env: str, num_envs: int, port: int, ready, stop,
           batching: str = 'free', tf_threads: int = 0, xla_flags: str = '',
           transport: str = 'courier') -> None:
  """Server process: one Courier server until `stop` is set."""
  os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
  if xla_flags:
    os.environ['XLA_FLAGS'] = xla_flags  # before TensorFlow is imported
  import seedacme  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from launchpad.nodes.courier import courier_utils  # pylint: disable=g-import-not-at-top
  shape, dtype, num_actions = ENV_SHAPES[env]

  if tf_threads:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.threading.set_intra_op_parallelism_threads(tf_threads)
    tf.config.threading.set_inter_op_parallelism_threads(tf_threads)
  from seedacme.wire import courier_guard  # pylint: disable=g-import-not-at-top
  courier_guard.install()  # the central node's wire: guarded, arrays as plain values
  if kind == 'echo':
    class Echo:
      def step(self, request: Dict[str, Any]) -> Dict[str, Any]:
        request = courier_guard.accept(request, 'step')
        return courier_guard.plain({'action': np.zeros(request['ids'].shape[1], np.int32)})

      def stats(self) -> Dict[str, float]:
        return {'batch_fill': float('nan')}
    target = Echo()
  else:
    from seedacme.types import EnvSpec  # pylint: disable=g-import-not-at-top
    from seedacme.serving.server import InferenceServer  # pylint: disable=g-import-not-at-top
    from seedacme.serving.policy import PolicyStep, StatelessPolicy  # pylint: disable=g-import-not-at-top
    spec = EnvSpec(shape, dtype, num_actions)
    if kind == 'seed':
      from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
      overrides = {'torso': 'impala_resnet'} if env == 'atari' else {}
      builder = registry.make_builder('vtrace', env, **overrides)
      policy = builder.make_policy(builder.make_networks(spec), spec, num_envs, num_envs)
    else:
      class NoWork(StatelessPolicy):
        def act(self, observation, eval_mask, env_ids):
          b = len(observation)
          return PolicyStep(np.zeros(b, np.int32), {'logits': np.zeros((b, num_actions),
                                                                       np.float32)}, ())
      policy = NoWork(num_envs)
    from seedacme.config import ProgramConfig  # pylint: disable=g-import-not-at-top
    from seedacme.run.accounting import ActingLog  # pylint: disable=g-import-not-at-top
    server = InferenceServer(
        policy, spec, num_envs, None,
        max_batch_envs=(_min_batch_envs(batching, num_envs)
                        or ProgramConfig.inference_batch_envs),
        batch_timeout_s=ProgramConfig.inference_timeout_ms / 1e3,
        acting=ActingLog())  # counting what it serves, as the central node's server does
    if hasattr(policy, 'warm_up'):
      policy.warm_up(range(1, num_envs + 1))

    shm_server = None
    if transport == 'shm':
      from seedacme.serving.shm_server import ShmServer  # pylint: disable=g-import-not-at-top
      shm_server = ShmServer(server, spec, num_envs)

    class Service:
      def step(self, request):
        return courier_guard.plain(server.step(courier_guard.accept(request, 'step')))

      def shm_offer(self, pid=None):
        return shm_server.offer(pid) if shm_server is not None else None

      def stats(self):
        s = server.batch_stats(reset=True)
        return courier_guard.plain({'batch_fill': s.mean_batch_units / server.batch_capacity})
    target = Service()
  courier_server = courier_utils.make_courier_server(target, port=port, thread_pool_size=16)
  courier_server.Start()
  ready.set()
  stop.wait()
  courier_server.Stop()


def _client(env: str, port: int, first_env_id: int, k: int, seconds: float, start,
            results, transport: str = 'courier') -> None:
  """Closed-loop client: K envs per call, as an actor would send them."""
  import threading  # pylint: disable=g-import-not-at-top
  import courier  # pylint: disable=g-import-not-at-top
  from seedacme.wire import protocol  # pylint: disable=g-import-not-at-top
  shape, dtype, _ = ENV_SHAPES[env]
  from seedacme.wire import courier_guard  # pylint: disable=g-import-not-at-top
  courier_client = courier.Client(f'localhost:{port}')

  class Client:
    """`step(request)` on seedacme's Courier wire, as an actor's `RpcTransport` calls."""

    def step(self, request):
      return courier_guard.accept(courier_client.step(courier_guard.plain(request)), 'reply')

    def shm_offer(self, pid):
      return courier_client.shm_offer(pid)
  client = Client()
  if transport == 'shm':
    from seedacme.actor.transport import ShmTransport  # pylint: disable=g-import-not-at-top
    from seedacme.types import Mode  # pylint: disable=g-import-not-at-top
    path = ShmTransport.attach(client.shm_offer(os.getpid()), first_env_id, k, threading.Event(),
                               'bench client')

    class ShmClient:
      """`step(request)` through the segment (the fields an actor would write)."""

      def step(self, request):
        f = protocol.fields(request)
        return path.step(f['env_ids'], f['run_ids'], f['observation'], f['reward'],
                         f['discount'], f['step_type'], Mode.TRAIN)
    client = ShmClient()
  rng = np.random.default_rng(first_env_id)
  obs = (rng.integers(0, 255, (k,) + shape) if dtype == 'uint8'
         else rng.random((k,) + shape)).astype(dtype)
  ids = np.arange(first_env_id, first_env_id + k)
  step_type = np.zeros(k, np.int8)
  request = protocol.make_request(ids, np.zeros(k, np.int64), obs, np.zeros(k), np.ones(k),
                                  step_type)
  client.step(request)  # FIRST step, and the connection is up
  request['transition'][2] = 1  # MID from now on
  for _ in range(20):
    client.step(request)
  start.wait()
  latencies = []
  t_end = time.monotonic() + seconds
  while time.monotonic() < t_end:
    t0 = time.perf_counter()
    client.step(request)
    latencies.append(time.perf_counter() - t0)
  results.put(np.asarray(latencies))


def measure(kind: str, env: str, clients: int, k: int, seconds: float,
            batching: str = 'free', tf_threads: int = 0,
            xla_flags: str = '', transport: str = 'courier') -> Dict[str, Any]:
  import portpicker  # pylint: disable=g-import-not-at-top
  ctx = multiprocessing.get_context('spawn')
  port = portpicker.pick_unused_port()
  ready, stop, start = ctx.Event(), ctx.Event(), ctx.Event()
  results = ctx.Queue()
  server = ctx.Process(target=_serve,
                       args=(kind, env, clients * k, port, ready, stop, batching,
                             tf_threads, xla_flags, transport))
  server.start()
  if not ready.wait(120):
    raise RuntimeError(f'{kind} server did not start')
  procs = [ctx.Process(target=_client,
                       args=(env, port, i * k, k, seconds, start, results, transport))
           for i in range(clients)]
  for p in procs:
    p.start()
  time.sleep(3.0)  # clients connected and warmed up
  import courier  # pylint: disable=g-import-not-at-top
  stats_client = courier.Client(f'localhost:{port}')
  stats_client.stats()  # reset the server's counters at the start of the window
  start.set()
  latencies = [results.get(timeout=seconds + 120) for _ in procs]
  fill = stats_client.stats()['batch_fill']
  for p in procs:
    p.join(30)
  stop.set()
  server.join(30)
  if server.is_alive():
    server.kill()
  all_lat = np.concatenate(latencies)
  requests = sum(len(x) for x in latencies)
  return {'server': kind, 'transport': transport,
          'batching': '-' if kind == 'echo' else batching,
          'tf_threads': tf_threads or 'default', 'xla_flags': xla_flags,
          'env': env, 'clients': clients, 'K': k,
          'requests_per_s': requests / seconds, 'env_steps_per_s': requests * k / seconds,
          'p50_ms': float(np.percentile(all_lat, 50) * 1e3),
          'p99_ms': float(np.percentile(all_lat, 99) * 1e3), 'batch_fill': fill,
          'load_1m': os.getloadavg()[0]}  # the machine's load at the end of the row


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--seconds', type=float, default=None)
  parser.add_argument('--only', default=None, help="'catch' or 'atari'")
  parser.add_argument('--configs', default=None, help="e.g. 'catch:8:1,catch:2:16'")
  parser.add_argument('--servers', default=None,
                      help="comma-separated subset of server:transport rows, e.g. "
                      "'echo:courier,seed:shm' (default: all)")
  parser.add_argument('--batching', default='',
                      help=f'comma-separated extra batching rows: {", ".join(BATCHING[1:])}')
  parser.add_argument('--tf_threads', default='',
                      help='comma-separated TF intra/inter-op thread counts: extra seed rows')
  parser.add_argument('--xla_single_thread', action='store_true',
                      help=f'an extra seed row with XLA_FLAGS={XLA_SINGLE_THREAD}')
  args = parser.parse_args()
  seconds = args.seconds or (3.0 if args.quick else 10.0)
  threads = [int(t) for t in args.tf_threads.split(',') if t]
  extra = [b for b in args.batching.split(',') if b]
  unknown = sorted(set(extra) - set(BATCHING))
  if unknown:
    parser.error(f'unknown --batching {unknown}; choose from {BATCHING}')
  configs = [('catch', 2, 16)] if args.quick else [
      ('catch', 8, 1), ('catch', 2, 1), ('catch', 2, 16), ('catch', 2, 64),
      ('catch', 4, 16), ('atari', 2, 16), ('atari', 2, 32)]
  if args.configs:
    configs = [(e, int(c), int(k)) for e, c, k in
               (x.split(':') for x in args.configs.split(','))]
  rows = []
  for env, clients, k in configs:
    if args.only and env != args.only:
      continue
    echo = None
    variants = [('echo', 'free', 0, ''), ('batcher', 'free', 0, ''), ('seed', 'free', 0, ''),
                ('batcher', 'free', 0, '', 'shm'), ('seed', 'free', 0, '', 'shm')]
    if env == 'catch':  # the IMPALA ResNet's forward pass sets Atari's pace either way
      variants += [(kind, b, 0, '') for b in extra for kind in ('batcher', 'seed')]
      variants += [('seed', 'free', n, '') for n in threads]
      if args.xla_single_thread:
        variants.append(('seed', 'free', 0, XLA_SINGLE_THREAD))
    courier_rows = {}
    for kind, batching, n, xla_flags, *transport in variants:
      transport = transport[0] if transport else 'courier'
      if args.servers and f'{kind}:{transport}' not in args.servers.split(','):
        continue
      row = measure(kind, env, clients, k, seconds, batching, n, xla_flags, transport)
      if transport == 'courier' and batching == 'free' and not n and not xla_flags:
        courier_rows[kind] = row
      elif transport == 'shm' and kind in courier_rows:
        row['of_courier'] = row['requests_per_s'] / courier_rows[kind]['requests_per_s']
      echo = echo or row
      row['of_echo'] = row['requests_per_s'] / echo['requests_per_s']
      rows.append(row)
      print(f"inference_service: {env} {clients}x{k} {kind} over {transport} "
            f"({row['batching']}, "
            f"TF threads {row['tf_threads']}{', ' + xla_flags if xla_flags else ''}): "
            f"{row['requests_per_s']:,.0f} req/s, p99 {row['p99_ms']:.2f} ms", flush=True)
  print()
  print_table(rows, ['env', 'clients', 'K', 'server', 'transport', 'batching', 'tf_threads',
                     'xla_flags', 'requests_per_s', 'env_steps_per_s', 'p50_ms', 'p99_ms',
                     'batch_fill', 'of_echo', 'of_courier'])
  path = write_json('inference_service_quick.json' if args.quick
                    else 'inference_service.json',
                    {'machine': machine(), 'seconds': seconds, 'rows': rows})
  print(f'inference_service: wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
