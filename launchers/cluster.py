"""`launchers/cluster`: the same SEED program across machines of your own.

    python -m seedacme.launchers.cluster catch vtrace 2 8 --logdir /shared/runs/catch \\
        --cluster_spec @cluster.json --replicas replay/0,learner/0      # on each host

Every node of the program is one replica with an address of its own: the cluster spec
gives each replica's `host:port`, per node group (`{"replay": ["gpu-host:7000"],
"learner": [...], "actor": [...], "evaluator": [...]}`; replica `actor/3` is node
`actor/3`), and `--replicas` names the ones this host starts. Run the same command with
the same code and flags on every host, each naming its replicas; the logdir must be one
directory every host sees (NFS at the same path, or a `gs://` bucket).

It runs on the machinery `vertex.py --emulate` tests (`launchers/emulation.py`):
Launchpad's Vertex AI executables, which are the only ones in Launchpad 0.5.0 that read
their peers' addresses from the environment (`CLUSTER_SPEC`), started as local processes
from a copy of the code. Hence the need for xmanager (requirements/vertex.txt) although
nothing goes to the cloud. The pools are the node groups, not Vertex's hardware-shaped
worker pools: your machines are what they are, so no hardware flags and no Vertex
pool rules. `--dry_run` builds the program, checks the cluster spec and `--replicas`
against it and prints which replica starts where; it needs neither xmanager nor the
other hosts.
"""

import argparse
import ipaddress
import json
import os
import socket
import sys
from typing import Dict, List, Sequence

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme.launchers import emulation, vertex
from seedacme.launchers.program_flags import ProgramArgsError, add_program_args, make_program_inputs

# --accelerator: what the central node must see (`seedacme.runtime.devices`).
ACCELERATORS = {'none': None, 'gpu': 'GPU'}


def bucket_problem(network: str, logdir: str) -> str | None:
  """Why `logdir` cannot serve replicas on `network`, or None. Isolated replicas reach
  loopback and the run's peers only (the TLS tunnel): a bucket is out of their reach,
  and a first checkpoint would fail minutes in. (The Slurm launcher asks the same.)"""
  if network != 'host' and '://' in logdir:
    return (f'--network isolated cannot use the logdir {logdir}: its replicas reach only '
            'loopback and the run\'s hosts, not a bucket. Use a shared filesystem path '
            '(NFS), or --network host on a private network')
  return None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog='launchers/cluster', description=__doc__.split('\n')[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_program_args(p, envs_per_actor=32, max_seconds=24 * 3600.0,
                   logdir_help='one directory every host sees at the same path (NFS), or a '
                   'gs:// bucket with --network host; required except with --dry_run',
                   standby_restarts=True)
  p.add_argument('--cluster_spec', default=None,
                 help='JSON (or @file) of every replica\'s host:port per node group: '
                 '{"replay": ["host:port"], "learner": [...], "actor": [...], ...} '
                 '(--dry_run prints a template); required except with --dry_run')
  p.add_argument('--replicas', default=None,
                 help='the replicas this host starts, e.g. replay/0,learner/0 or '
                 'actor/0,actor/1,evaluator/0 (default: all)')
  p.add_argument('--accelerator', default='none', choices=tuple(ACCELERATORS),
                 help='gpu: the central node (learner/0) refuses to start without one '
                 'rather than train on the CPU')
  p.add_argument('--replica_logs', default=None,
                 help='where this host\'s replica logs go (default: <logdir>/replicas, '
                 'or ./replicas for a gs:// logdir)')
  p.add_argument('--dry_run', action='store_true',
                 help='build the program, check --cluster_spec and --replicas, print which '
                 'replica starts where; start nothing (needs no xmanager)')
  p.add_argument('--json', action='store_true', help='print the plan as JSON')
  p.add_argument('--network', choices=('isolated', 'loopback', 'host'), default='isolated',
                 help='isolated: this host\'s replicas run in a private network namespace '
                 'with only loopback (where none can be made: their servers kept on '
                 'loopback, other uids refused at accept), and the only thing listening '
                 'on its spec address is the run\'s mutual-TLS endpoint; refuses to start '
                 'where neither holds; loopback: that fallback even where a namespace '
                 'could be made; host: every replica listens on every interface, '
                 'unauthenticated (' + EXPOSURE + ')')
  p.add_argument('--tls_dir', default=None,
                 help='this host\'s own credentials: ca.pem plus cert.pem and key.pem '
                 '(or ca.key to issue them from, which puts the CA key on every host); '
                 'default: the first host to start makes the run\'s CA in memory, a '
                 'certificate per host of the spec in <logdir>/tls, and no CA key '
                 'anywhere (valid for the time budget plus a day, removed when the run '
                 'ends)')
  p.add_argument('--allow_public_addresses', action='store_true',
                 help='with --network host: accept cluster spec addresses outside '
                 'loopback and private ranges (refused by default: ' + EXPOSURE + ')')
  return p.parse_args(argv)


EXPOSURE = ('Courier and Reverb have no authentication: anyone who can reach a '
            "replica's port can send inference requests and reports, and read, write or "
            'reset the replay')


def _resolve(host: str) -> List[str]:
  """The addresses `host` names (a literal address: itself). A lookup, never a
  connection; a name that does not resolve is checked as unknown."""
  host = host.strip('[]')
  try:
    ipaddress.ip_address(host)
    return [host]
  except ValueError:
    pass
  try:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
  except OSError:
    return []


def public_addresses(hosts: Dict[str, List[str]], resolve=_resolve) -> List[str]:
  """The spec's `host:port` entries that are not on loopback or a private network
  (RFC 1918, RFC 6598 shared space, IPv6 unique-local and link-local), or that do not
  resolve: where an open port is reachable from outside."""
  exposed = []
  for addresses in hosts.values():
    for address in addresses:
      host = str(address).rpartition(':')[0]
      ips = resolve(host)
      if not ips or any(_is_public(ip) for ip in ips):
        exposed.append(f'{address} ({", ".join(ips) or "does not resolve"})')
  return exposed


_PRIVATE_V4 = [ipaddress.ip_network(n) for n in (
    '127.0.0.0/8', '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16',
    '100.64.0.0/10',  # shared address space: carrier-grade NAT, Tailscale
    '169.254.0.0/16')]
_PRIVATE_V6 = [ipaddress.ip_network(n) for n in ('::1/128', 'fc00::/7', 'fe80::/10')]


def _is_public(ip: str) -> bool:
  address = ipaddress.ip_address(ip.split('%')[0])
  if address.version == 6 and address.ipv4_mapped is not None:
    address = address.ipv4_mapped
  private = _PRIVATE_V4 if address.version == 4 else _PRIVATE_V6
  return not any(address in network for network in private)


def plan_pools(groups: Dict[str, int]) -> Dict[str, List[str]]:
  """One pool per node group, named by it: replica `group/i` is node `group/i`."""
  return {group: [f'{group}/{i}' for i in range(count)] for group, count in groups.items()}


def host_resources(groups: Sequence[str], code_directory: str) -> Dict[str, object]:
  """Node group -> the `lp.DockerConfig` its executable is built from.

  Only the code directory matters on your machines: replicas run on this interpreter's
  packages, so the requirements file Launchpad copies next to the code (the lock) is
  installed by nobody, and no hardware is requested from anyone.
  """
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  return {group: lp.DockerConfig(code_directory, vertex.LOCK, python_path=[code_directory])
          for group in groups}


def spec_template(pools: Dict[str, List[str]]) -> Dict[str, List[str]]:
  """A `--cluster_spec` to fill in: one `HOST:PORT` per replica."""
  return {pool: ['HOST:PORT'] * len(labels) for pool, labels in pools.items()}


def format_plan(pools: Dict[str, List[str]], hosts: Dict[str, List[str]] | None,
                mine: set) -> str:
  """One line per replica: its address (when given) and whether this host starts it."""
  lines = [f'{"replica":<14} {"address":<24} starts here']
  for pool, labels in pools.items():
    for index, label in enumerate(labels):
      address = hosts[pool][index] if hosts else '-'
      lines.append(f'{label:<14} {address:<24} {"yes" if (pool, index) in mine else ""}')
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if not args.dry_run:
    missing = [f for f, v in (('--cluster_spec', args.cluster_spec), ('--logdir', args.logdir))
               if not v]
    if missing:
      print(f'cluster: {" and ".join(missing)} required (--dry_run shows the replicas '
            'to give addresses for)', file=sys.stderr)
      return 2
    problem = emulation.missing_xmanager() or vertex.temp_dir_error()
    if problem:
      print(f'cluster: {problem}', file=sys.stderr)
      return 2
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top

  logdir = args.logdir or '<--logdir>'
  if args.logdir and '://' not in logdir:
    logdir = os.path.abspath(logdir)  # the replicas run from their copied directories
  try:
    factory, spec, builder, config = make_program_inputs(
        args, logdir, accelerator=ACCELERATORS[args.accelerator])
  except ProgramArgsError as e:
    print(f'cluster: {e}', file=sys.stderr)
    return 2
  program = program_lib.make_program(
      builder, factory, spec, config,
      stop_program=None if args.dry_run else emulation.program_stopper(),
      name=f'seedacme-{args.env}-{args.agent}')
  pools = plan_pools({label: len(nodes) for label, nodes in program.groups.items()})
  counts = {pool: len(labels) for pool, labels in pools.items()}
  try:
    hosts = emulation.parse_cluster_spec(args.cluster_spec, counts) if args.cluster_spec \
        else None
    mine = emulation.parse_replicas(args.replicas, counts)
  except ValueError as e:
    print(f'cluster: {e}', file=sys.stderr)
    return 2
  # Isolated, nothing but the TLS endpoint listens on this host's address, so a public
  # address is a TLS port (as a gRPC server's); on the host network it is every port.
  exposed = public_addresses(hosts) if hosts and args.network == 'host' else []
  if exposed and not args.allow_public_addresses:
    print(f'cluster: refusing addresses outside loopback and private networks: '
          f'{", ".join(exposed)}. {EXPOSURE}; --allow_public_addresses starts it anyway',
          file=sys.stderr)
    return 2
  if hosts and args.network == 'host':
    print(f'cluster: --network host: {EXPOSURE}' +
          (' (public addresses allowed by flag)' if exposed else ''), file=sys.stderr)
  # Another user's logdir (or one others can write into) is refused here, in one line.
  problem = bucket_problem(args.network, logdir) or \
      emulation.logdir_lib.local_logdir_problem(logdir)
  if problem:
    print(f'cluster: {problem}', file=sys.stderr)
    return 2
  if not args.dry_run and args.network != 'host':
    from seedacme.runtime import isolation  # pylint: disable=g-import-not-at-top
    chosen = isolation.choose_isolation(
        ('namespace', 'loopback') if args.network == 'isolated' else ('loopback',))
    if chosen.mechanism is None:
      print(f'cluster: cannot isolate the replicas ({chosen.reason}), so every replica '
            f'would listen on every interface: {EXPOSURE}. Refusing to start; '
            '--network host runs exposed anyway (on a private network or VPN)',
            file=sys.stderr)
      return 2

  if args.json:
    print(json.dumps({
        'program': program.name, 'logdir': logdir, 'pools': pools,
        'replicas': [dict(replica=label, address=hosts[pool][i] if hosts else None,
                          starts_here=(pool, i) in mine)
                     for pool, labels in pools.items() for i, label in enumerate(labels)],
        'cluster_spec': hosts or spec_template(pools)}, indent=1))
  else:
    print(f'cluster plan for {program.name} ({sum(counts.values())} replicas, '
          f'logdir {logdir}):')
    print(format_plan(pools, hosts, mine))
    if not hosts:
      print(f'--cluster_spec template: {json.dumps(spec_template(pools))}')
  if args.dry_run:
    if not args.json:
      print('cluster: plan is valid (dry run: nothing started)' if hosts else
            'cluster: dry run: nothing started; to run, give every replica\'s address '
            'as --cluster_spec (the template above) and a shared --logdir')
    return 0
  code_directory = vertex.stage_code_directory()
  return emulation.run(program, pools, host_resources(list(pools), code_directory), logdir,
                       args.replica_logs, hosts, mine, launcher='cluster',
                       network=args.network, tls_dir=args.tls_dir,
                       time_budget_s=config.time_budget)


if __name__ == '__main__':
  sys.exit(main())
