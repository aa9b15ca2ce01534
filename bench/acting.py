"""Acting throughput: central (SEED) vs actor-side (Acme) inference, side by side.

    .venv/bin/python bench/acting.py            # Catch and Pong, ~15 minutes
    .venv/bin/python bench/acting.py --quick    # Catch, 2 actors, ~2 minutes (CI smoke)

For every configuration (env, actor processes, envs per actor K) the same program runs
three times with `--acting_only` (no learner, no trajectories: the learner would
otherwise set the pace) and no evaluator: central inference with its requests over
Courier (`central_*`, `--transport courier`), central inference over shared memory
(`shm_*`, `--transport shm`: the default on one host), and actor-side inference
(`actor_*`). Also measured in the same run:
the raw env ceiling, the same envs in the same number of processes stepping random
actions with no inference at all (the same engine: ale-py's C++ vector env for Pong).
Pong serves SEED's IMPALA ResNet torso.

Also per row: CPU microseconds per env step of the actor nodes and of the central node
(user + system of all their processes, over the same steady window as the rate): with
every core busy, the mode that spends less CPU per env step serves more env steps.

`--cross_host` adds `cross_*` rows: central inference with the actors on another host,
over Courier (the only way there), beside the same-host rows. The hosts are emulated
(`tests/emulated_hosts.py`: network namespaces on one machine, unprivileged) and the
program is started by the cluster launcher on each, as a user would across machines:
the central node and replay on host A, every actor on host B. One kernel still carries
both ends, so the rows show the cost of Courier's network path (TCP over a veth pair and
a bridge instead of loopback) and the absence of shared memory, not a real network's
latency. Needs xmanager (requirements/vertex.txt) and user namespaces.
`cross_*` runs with `--network host` (plain Courier between the hosts, as before issue
47); `tls_*` is the same program with the cluster launcher's default, every host's
replicas in a private namespace behind the run's mutual-TLS endpoint
(`seedacme/wire/tls_tunnel.py`): each request crosses B's sidecar, TLS, A's sidecar.
The sidecar is a thread of each host's launcher, so its CPU shows as `tunnel` (the
launchers' processes, steady window only).

Prints the tables and writes bench/results/acting[_quick].json (`--out` names another). Asserts nothing about
speed: it reports.
"""

import argparse
import json
import os
import shutil
import sys
import time

import psutil

from harness import (REPO, TAG_VAR, ProgramRun, env_ceiling, machine, print_table,
                     tagged_processes, write_json)

# Frames per env step: Atari repeats each action 4 times.
FRAMES_PER_STEP = {'catch': 1, 'atari': 4}
# How actors step their K envs: Atari with ale-py's C++ vector engine (envs/atari_vector.py).
ENGINES = {'catch': 'python', 'atari': 'vector_sync'}


def configs(quick: bool):
  if quick:
    return [('catch', 2, 16)]
  return [('catch', 8, 1), ('catch', 16, 1), ('catch', 2, 1), ('catch', 2, 16),
          ('catch', 2, 64), ('catch', 4, 16), ('atari', 2, 16), ('atari', 4, 16)]


# Runs per configuration: (row prefix, program flags). `central` keeps its published
# meaning (requests over Courier); `shm` is central inference over shared memory.
MODES = (('central', ['--inference', 'central', '--transport', 'courier']),
         ('shm', ['--inference', 'central', '--transport', 'shm']),
         ('actor', ['--inference', 'actor']))


CROSS = (('cross', ['--inference', 'central', '--transport', 'courier', '--network', 'host']),
         ('tls', ['--inference', 'central', '--transport', 'courier']))


class CrossHostRun(ProgramRun):
  """The same program through `launchers/cluster.py` on two emulated hosts: replay
  and the central node on A, the actors on B; read from outside as `ProgramRun` does
  (progress from the shared logdir, CPU and RSS per node from the replicas' logs)."""

  def run(self, timeout_s: float):
    sys.path.insert(0, REPO)
    from tests.emulated_hosts import EmulatedHosts  # pylint: disable=g-import-not-at-top
    from tests.integration.launch import tmpdir_without_underscore  # pylint: disable=g-import-not-at-top
    actors = int(self.args[2])  # [env, agent, actors, K, ...]
    logs = os.path.join(self.workdir, 'replicas') + os.sep
    # Launchpad refuses a temp dir with '_' (mkdtemp's suffix has one 1 time in 5).
    tmp = tmpdir_without_underscore('seedacmecross')
    start = time.monotonic()
    code, timed_out, offset = 1, False, 0
    try:
      with EmulatedHosts(['a', 'b']) as hosts:
        a, b = hosts.addresses['a'], hosts.addresses['b']
        spec = {'replay': [f'{a}:7000'], 'learner': [f'{a}:7001'],
                'actor': [f'{b}:{7100 + i}' for i in range(actors)]}
        spec_file = os.path.join(self.workdir, 'cluster.json')
        with open(spec_file, 'w') as f:
          json.dump(spec, f)
        handles = {}
        for host, replicas in (('a', 'replay/0,learner/0'),
                               ('b', ','.join(f'actor/{i}' for i in range(actors)))):
          os.makedirs(os.path.join(tmp, host))
          handles[host] = hosts.run(
              host, [sys.executable, '-m', 'seedacme.launchers.cluster', *self.args,
                     '--progress_interval_s', '1', '--cluster_spec', f'@{spec_file}',
                     '--replicas', replicas, '--replica_logs', logs],
              env={**self.env, TAG_VAR: self.tag, 'TMPDIR': os.path.join(tmp, host)},
              log=os.path.join(self.workdir, f'launcher_{host}.txt'), cwd=REPO)
        while any(hosts.poll(h) is None for h in handles.values()):
          time.sleep(0.5)
          now = time.monotonic() - start
          if now > timeout_s:
            timed_out = True
            break
          offset = self._read_progress(offset, now)
          self._sample(logs)
        code = max(abs(hosts.poll(h) or 0) for h in handles.values()) if not timed_out \
            else 1
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    self._read_progress(offset, time.monotonic() - start)
    summary = self.summary_or_empty()
    leftovers = [p.pid for p in tagged_processes(self.tag)]
    self.release_workdir(clean=code == 0 and not timed_out and not leftovers)
    return {'exit_code': code, 'timed_out': timed_out, 'leftovers': leftovers,
            'summary': summary, 'wall_s': time.monotonic() - start,
            'load_1m_at_end': os.getloadavg()[0]}

  def summary_or_empty(self):
    from seedacme.run import logdir as logdir_lib  # pylint: disable=g-import-not-at-top
    return logdir_lib.read_summary(self.logdir) or {}

  def _sample(self, logs: str) -> None:
    """RSS and CPU per node (`actor-0` log -> node `actor/0`), as `ProgramRun`."""
    rss, cpu = {}, {}
    for p in tagged_processes(self.tag):
      try:
        out = os.readlink(f'/proc/{p.pid}/fd/1')
        if out.startswith(os.path.join(self.workdir, 'launcher_')):
          node = 'tunnel/' + out[-5]  # launcher_<host>.txt: the sidecar's thread
        elif out.startswith(logs):
          node = out[len(logs):].replace('-', '/')
        else:
          continue
        rss[node] = rss.get(node, 0.0) + p.memory_info().rss / 2**20
        times = p.cpu_times()
        cpu[p.pid] = (node, times.user + times.system)
      except (OSError, psutil.Error):
        continue
    for node, mb in rss.items():
      self.peak_rss[node] = max(self.peak_rss.get(node, 0.0), mb)
    if self.records and self.records[-1].get('env_steps'):
      self._cpu_seen.update(cpu)
      per_node = {}
      for node, seconds in self._cpu_seen.values():
        per_node[node] = per_node.get(node, 0.0) + seconds
      self.cpu_samples.append((self.records[-1]['elapsed_s'], time.monotonic(), per_node))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--seconds', type=float, default=None,
                      help='program budget per run (default 35; quick 15)')
  parser.add_argument('--only', default=None, help="'catch' or 'atari'")
  parser.add_argument('--modes', default=None,
                      help="comma-separated subset of 'central,shm,actor' (default: all)")
  parser.add_argument('--configs', default=None,
                      help="e.g. 'catch:2:1,atari:2:16' (default: all of configs())")
  parser.add_argument('--cross_host', action='store_true',
                      help='add cross_* rows: actors on another emulated host, over '
                      'Courier, through the cluster launcher (module docstring)')
  parser.add_argument('--out', default=None,
                      help='name of the JSON in bench/results/ (default acting[_quick].json)')
  args = parser.parse_args()
  modes = MODES + (CROSS if args.cross_host else ())
  seconds = args.seconds or (15.0 if args.quick else 35.0)
  rows = []
  chosen = configs(args.quick) if not args.configs else [
      (e, int(a), int(k)) for e, a, k in (c.split(':') for c in args.configs.split(','))]
  for env, actors, k in chosen:
    if args.only and env != args.only:
      continue
    engine = ENGINES[env]
    extra = ['--agent_config', 'torso=impala_resnet'] if env == 'atari' else []
    extra += ['--env_engine', engine]
    row = {'env': 'pong' if env == 'atari' else env, 'actors': actors, 'K': k,
           'engine': engine}
    for mode, flags in modes:
      if args.modes and mode not in args.modes.split(','):
        continue
      kind = CrossHostRun if mode in ('cross', 'tls') else ProgramRun
      run = kind([env, 'vtrace', str(actors), str(k), *flags,
                  '--acting_only', '--num_eval_envs', '0',
                  '--max_seconds', str(seconds), *extra], f'{env}_{mode}')
      started = time.monotonic()
      result = run.run(timeout_s=seconds + 150)
      rate = run.steady_rate('env_steps') * FRAMES_PER_STEP[env]
      row[f'{mode}_per_s'] = rate
      row[f'{mode}_actor_rss_mb'] = run.node_rss('actor')
      row[f'{mode}_learner_rss_mb'] = run.node_rss('learner')
      row[f'{mode}_exit'] = result['exit_code']
      row[f'{mode}_load_1m'] = result['load_1m_at_end']  # other work skews the numbers
      # Where the CPU goes per env step: the actors' nodes and the central node's.
      for group in ('actor', 'learner', 'tunnel'):
        row[f'{mode}_{group}_cpu_us_per_step'] = run.cpu_us_per_step(group)
      print(f'acting: {env} {actors}x{k} {mode}: {rate:,.0f} '
            f'{"frames" if env == "atari" else "steps"}/s (exit {result["exit_code"]}, '
            f'{time.monotonic() - started:.0f}s, logdir {run.logdir})', flush=True)
    row['ceiling_per_s'] = env_ceiling(env, actors, k, seconds=3.0 if args.quick else 8.0,
                                       engine=engine) * FRAMES_PER_STEP[env]
    ran = [m for m, _ in modes if f'{m}_per_s' in row]
    for mode in ran:
      row[f'{mode}_cpu_us_per_step'] = (row[f'{mode}_actor_cpu_us_per_step']
                                        + row[f'{mode}_learner_cpu_us_per_step'])
      if mode in ('cross', 'tls'):  # the launchers (and in `tls` their sidecars)
        row[f'{mode}_cpu_us_per_step'] += row[f'{mode}_tunnel_cpu_us_per_step']
      row[f'{mode}_of_ceiling'] = row[f'{mode}_per_s'] / row['ceiling_per_s']
    for a, b in (('central', 'actor'), ('shm', 'actor'), ('shm', 'central'),
                 ('cross', 'central'), ('cross', 'shm'), ('tls', 'cross')):
      if a in ran and b in ran:  # None where a mode measured no steps (nothing to compare)
        row[f'{a}_vs_{b}'] = (row[f'{a}_per_s'] / row[f'{b}_per_s']
                              if row[f'{b}_per_s'] > 0 else None)
    rows.append(row)
  print('\nenv steps/s (Catch) or frames/s (Pong); RSS of the largest actor node '
        '(supervisor + child) in MB')
  print_table(rows, ['env', 'actors', 'K', 'engine', 'central_per_s', 'shm_per_s',
                     'actor_per_s', *(['cross_per_s', 'tls_per_s', 'tls_vs_cross',
                                       'cross_vs_central', 'cross_vs_shm']
                                      if args.cross_host else []),
                     'central_vs_actor', 'shm_vs_actor', 'shm_vs_central',
                     'ceiling_per_s', 'shm_of_ceiling', 'shm_actor_rss_mb',
                     'actor_actor_rss_mb'])
  print('\nCPU microseconds per env step (user + system, all processes of the node type):'
        ' actor nodes + central node = total')
  print_table(rows, ['env', 'actors', 'K', 'central_actor_cpu_us_per_step',
                     'central_learner_cpu_us_per_step', 'central_cpu_us_per_step',
                     'shm_actor_cpu_us_per_step', 'shm_learner_cpu_us_per_step',
                     'shm_cpu_us_per_step', 'actor_actor_cpu_us_per_step',
                     'actor_learner_cpu_us_per_step', 'actor_cpu_us_per_step',
                     *(['cross_actor_cpu_us_per_step', 'cross_learner_cpu_us_per_step',
                        'cross_cpu_us_per_step', 'tls_actor_cpu_us_per_step',
                        'tls_learner_cpu_us_per_step', 'tls_tunnel_cpu_us_per_step',
                        'tls_cpu_us_per_step'] if args.cross_host else [])])
  path = write_json(args.out or ('acting_quick.json' if args.quick else 'acting.json'),
                    {'machine': machine(), 'seconds_per_run': seconds, 'rows': rows})
  print(f'acting: wrote {path}')
  failed = [r for r in rows if any(r.get(f'{m}_exit') for m, _ in modes)]
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
