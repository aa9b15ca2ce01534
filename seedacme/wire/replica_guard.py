"""A Vertex job's replica, authenticated: servers on the container's loopback, the run's
mutual-TLS endpoint on the replica's address (issue 64).

    python -m seedacme.wire.replica_guard -- python -m process_entry --data_file=job.pkl

Launchpad 0.5.0 starts every replica of a Vertex job as `python -m process_entry` in a
container of the job's VPC, with its peers' addresses in `CLUSTER_SPEC`. Courier and
Reverb there bind `[::]:port` and authenticate no one, and a container cannot make a
network namespace. So `launchers/vertex.py` makes this module each container's
entrypoint, in front of Launchpad's:

1. It reads `CLUSTER_SPEC` (which replica this is, every peer's host) and the job's
   manifest (`MANIFEST`, staged into the code directory at submission: where the
   credentials are, which replica runs the central node; no secret).
2. It fetches this replica's credentials from the job's store: the job's CA
   certificate and a leaf naming this replica's slot (`workerpool1-0.replica...`),
   issued at submission, the CA key never written (`tls_tunnel.issue_slot_credentials`).
   Vertex names its hosts only when the job runs, so a leaf names the slot, and a peer
   is checked against what its slot's spec host resolves to (`tls_tunnel.slot_plan`).
3. It opens the run's TLS endpoint on the replica's spec address (`tls_tunnel.Tunnel`,
   mechanism 'loopback') and runs Launchpad's entrypoint under the loopback interposer
   (`seedacme/runtime/loopback_bind.c`, built here if the image lacks it) with the
   cluster spec rewritten: itself at its port on loopback, every peer at an alias
   port whose listener the endpoint carries over TLS to that peer.
4. Once the servers are up it checks what listens (nothing beyond loopback, or the
   replica is stopped), passes SIGTERM on, and exits with the replica's code. The
   central node's replica removes the job's store when the run ended well.

`vertex --emulate` runs exactly this per replica on one host: every emulated container
gets an address of its own (127.0.1.x) and a loopback of its own (127.0.2.x,
`SEEDACME_REPLICA_LOOPBACK`), the store is a private directory in the logdir.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Sequence

from seedacme.runtime import isolation, owned_paths
from seedacme.wire import tls_tunnel

MANIFEST = 'seedacme-job.json'
LOOPBACK_ENV = 'SEEDACME_REPLICA_LOOPBACK'  # the emulation's per-container loopback
SETTLE_S = 30.0  # after this, what the replica listens on is checked


class GuardError(RuntimeError):
  """The replica cannot start authenticated; the message says why."""


def write_manifest(code_directory: str, store: str, run_name: str, central: str,
                   budget_s: float | None) -> str:
  """The job's manifest in the staged code directory (copied into every image):
  `central` is the slot ('pool/index') of the central node."""
  path = os.path.join(code_directory, MANIFEST)
  owned_paths.replace_file(path, json.dumps(
      {'store': store, 'run_name': run_name, 'central': central, 'budget_s': budget_s},
      indent=1) + '\n')
  return path


def entrypoint(command: Sequence[str]) -> List[str]:
  """A replica's command with the guard in front (what a container runs)."""
  return ['python', '-m', 'seedacme.wire.replica_guard', '--', *command]


def read_cluster_spec(environ: Dict[str, str]) -> tuple:
  """(spec, (pool, index)) from `CLUSTER_SPEC`; GuardError naming what is wrong."""
  try:
    parsed = json.loads(environ['CLUSTER_SPEC'])
    spec, task = parsed['cluster'], parsed['task']
    me = (str(task['type']), int(task['index']))
    if not isinstance(spec, dict) or me[1] >= len(spec[me[0]]):
      raise KeyError(me)
  except KeyError as e:
    raise GuardError(f'CLUSTER_SPEC is missing or does not name this replica ({e})') from None
  except (ValueError, TypeError) as e:
    raise GuardError(f'CLUSTER_SPEC cannot be read: {e}') from None
  return spec, me


def _library(directory: str) -> str:
  """The interposer: the one built for this Python (scripts/setup), else built now into
  `directory` (a Vertex image has the compiler Python's own build needed)."""
  found = isolation.preload_library()
  if not found.problem:
    return found.path
  return isolation.build_library(os.path.join(directory, isolation.LIBRARY_NAME))


def _check_listeners(child: subprocess.Popen, exposed: List[str], stop: threading.Event,
                     name: str) -> None:
  if stop.wait(SETTLE_S) or child.poll() is not None:
    return
  found = isolation.exposed_listeners([child.pid])
  if found:
    exposed.extend(found)
    print(f'{name}: the replica listens beyond loopback despite the interposer: '
          f'{", ".join(exposed)}; stopping it', file=sys.stderr, flush=True)
    child.terminate()


def run(command: Sequence[str], environ: Dict[str, str] | None = None,
        manifest_path: str = MANIFEST) -> int:
  """Runs `command` (Launchpad's entrypoint) as described above; its exit code."""
  environ = dict(os.environ if environ is None else environ)
  spec, me = read_cluster_spec(environ)
  name = f'replica_guard {me[0]}/{me[1]}'
  try:
    with open(manifest_path) as f:
      manifest = json.load(f)
    store = manifest['store']
  except (OSError, ValueError, KeyError) as e:
    raise GuardError(f'the job\'s manifest {manifest_path} cannot be read: {e}') from None
  loopback = environ.pop(LOOPBACK_ENV, '') or '127.0.0.1'
  if not isolation.is_loopback(loopback):
    raise GuardError(f'{LOOPBACK_ENV}={loopback} is not a loopback address')
  work = owned_paths.private_tempdir(prefix='seedacme-guard-')
  library_dir = owned_paths.private_tempdir(prefix='seedacme-guard-lib-')
  tunnel = None
  try:
    # Tunnel.env preloads what library_path() names, for as long as the replica runs.
    os.environ[isolation.LIBRARY_ENV] = environ[isolation.LIBRARY_ENV] = _library(library_dir)
    plan, local = tls_tunnel.slot_plan(spec, me, loopback)
    creds = tls_tunnel.fetch_slot_credentials(store, me[0], me[1], work)
    tunnel = tls_tunnel.Tunnel(plan, creds, 'loopback')
    shutil.rmtree(work, ignore_errors=True)  # the contexts hold the key now
    print(f'{name}: isolation: loopback (servers on {loopback} only); mutual TLS on '
          f'{plan.address} ports {plan.inbound}; {len(plan.outbound)} peers through it',
          flush=True)
    env = tunnel.env(environ)
    env['CLUSTER_SPEC'] = json.dumps({'cluster': local,
                                      'task': {'type': me[0], 'index': me[1]}})
    # `python`: the interpreter running this guard (the image's; the emulation's venv).
    argv = [sys.executable if command[0] == 'python' else command[0], *command[1:]]
    child = subprocess.Popen(argv, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT):
      signal.signal(sig, lambda signum, _: child.send_signal(signum))
    exposed: List[str] = []
    stop = threading.Event()
    threading.Thread(target=_check_listeners, args=(child, exposed, stop, name),
                     daemon=True).start()
    code = child.wait()
    stop.set()
    print(f'{name}: replica ended with {code}; TLS endpoint {tunnel.counters.as_dict()}',
          flush=True)
    if code == 0 and f'{me[0]}/{me[1]}' == manifest.get('central'):
      if tls_tunnel.remove_slot_credentials(store):
        print(f'{name}: the run ended; the job\'s credentials removed from {store}',
              flush=True)
    return 1 if exposed else code
  finally:
    if tunnel is not None:
      tunnel.close()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(library_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='replica_guard', description=__doc__.split('\n')[0])
  parser.add_argument('--manifest', default=MANIFEST)
  parser.add_argument('command', nargs=argparse.REMAINDER,
                      help='-- then the replica\'s own command')
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    parser.error('give the replica\'s command after --')
  try:
    return run(command, manifest_path=args.manifest)
  except (GuardError, tls_tunnel.TunnelError, isolation.IsolationError,
          owned_paths.UnsafePathError) as e:
    print(f'replica_guard: refusing to start the replica: {e}', file=sys.stderr, flush=True)
    return 2


if __name__ == '__main__':
  sys.exit(main())
