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

`--modes ...,central_loopback,shm_loopback` adds the same programs under issue 64's
fallback: `--network loopback`, every node's servers kept on loopback by the LD_PRELOAD
interposer (`seedacme/runtime/isolation.py`: binds moved, other uids' connections
refused at accept) instead of the default private namespace. `<mode>_loopback_vs_<mode>`
is loopback over namespace. The difference sought is a few per cent on 2 shared cores
whose load moves a run's rate by tens of per cent, so `--repeats N` runs every mode N times per config,
interleaved (the mode order reversed every round: A B B A A B), and the row holds each
mode's median (`<mode>_runs`: the rates, `<mode>_spread`: (max - min) / median;
`<a>_vs_<b>_paired`: the median of the rounds' ratios, each of two runs side by side); the
JSON's `runs` has every run with the load average before and after it and the isolation
its launcher said it used (a mode that did not get the one it asked for fails the run).

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

from harness import (REPO, TAG_VAR, ProgramRun, commit, env_ceiling, machine,
                     print_table, tagged_processes, write_json)

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

# Issue 64's fallback beside the namespace: named in --modes only (not in the default set).
LOOPBACK = tuple((f'{mode}_loopback', [*flags, '--network', 'loopback'])
                 for mode, flags in MODES if mode in ('central', 'shm'))
# The isolation each mode's launcher must report ('seedacme: isolation: <it>').
EXPECTED_ISOLATION = {**{m: 'namespace' for m, _ in MODES},
                      **{m: 'loopback' for m, _ in LOOPBACK}}


def interleaved(modes, repeats: int):
  """(round, mode) in run order: the modes forward, then backward, ... (A B B A A B):
  a load that drifts over the rounds falls on every mode alike."""
  for r in range(repeats):
    for mode in (modes if r % 2 == 0 else modes[::-1]):
      yield r, mode


def median(values):
  """Median of the finite values (NaN when none: a run that measured no steps)."""
  finite = sorted(v for v in values if isinstance(v, (int, float)) and v == v)
  if not finite:
    return float('nan')
  mid = len(finite) // 2
  return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2


def isolation_said(workdir: str) -> str | None:
  """The isolation the launcher said it used, from the run's stdout (None: not said)."""
  try:
    with open(os.path.join(workdir, 'stdout.txt'), errors='replace') as f:
      for line in f:
        if line.startswith('seedacme: isolation: '):
          return line.split()[2]
  except OSError:
    pass
  return None


def loads() -> list:
  return [round(x, 2) for x in os.getloadavg()]


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
                      help="comma-separated, of 'central,shm,actor' (the default: all "
                      "three), 'central_loopback,shm_loopback' (issue 64's fallback) and "
                      "with --cross_host 'cross,tls'")
  parser.add_argument('--repeats', type=int, default=1,
                      help='runs of every mode per config, interleaved; rows hold medians')
  parser.add_argument('--configs', default=None,
                      help="e.g. 'catch:2:1,atari:2:16' (default: all of configs())")
  parser.add_argument('--cross_host', action='store_true',
                      help='add cross_* rows: actors on another emulated host, over '
                      'Courier, through the cluster launcher (module docstring)')
  parser.add_argument('--out', default=None,
                      help='name of the JSON in bench/results/ (default acting[_quick].json)')
  args = parser.parse_args()
  known = MODES + LOOPBACK + (CROSS if args.cross_host else ())
  modes = MODES + (CROSS if args.cross_host else ())
  if args.modes:
    asked = args.modes.split(',')
    unknown = [m for m in asked if m not in dict(known)]
    if unknown:
      parser.error(f'--modes: unknown {unknown}; known: {[m for m, _ in known]}'
                   + ('' if args.cross_host else " ('cross', 'tls' need --cross_host)"))
    modes = tuple((m, dict(known)[m]) for m in dict.fromkeys(asked))  # in the order asked
  if args.repeats < 1:
    parser.error(f'--repeats must be at least 1, got {args.repeats}')
  seconds = args.seconds or (15.0 if args.quick else 35.0)
  load_at_start = loads()
  rows, runs = [], []
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
    flags_of = dict(modes)
    measured = {m: [] for m, _ in modes}  # mode -> the figures of each of its runs
    for rnd, mode in interleaved([m for m, _ in modes], args.repeats):
      kind = CrossHostRun if mode in ('cross', 'tls') else ProgramRun
      run = kind([env, 'vtrace', str(actors), str(k), *flags_of[mode],
                  '--acting_only', '--num_eval_envs', '0',
                  '--max_seconds', str(seconds), *extra], f'{env}_{mode}')
      started, load_before = time.monotonic(), loads()
      result = run.run(timeout_s=seconds + 150)
      rate = run.steady_rate('env_steps') * FRAMES_PER_STEP[env]
      moving = [r['elapsed_s'] for r in run.records if r.get('env_steps')]
      steady_s = moving[-1] - moving[0] - 5.0 if moving else 0.0  # steady_rate's window
      figures = {'per_s': rate, 'actor_rss_mb': run.node_rss('actor'),
                 'learner_rss_mb': run.node_rss('learner'), 'exit': result['exit_code'],
                 'load_1m': result['load_1m_at_end']}  # other work skews the numbers
      # Where the CPU goes per env step: the actors' nodes and the central node's
      # (and in `cross`/`tls` the launchers, in `tls` their sidecars).
      for group in ('actor', 'learner', 'tunnel'):
        figures[f'{group}_cpu_us_per_step'] = run.cpu_us_per_step(group)
      figures['cpu_us_per_step'] = (figures['actor_cpu_us_per_step']
                                    + figures['learner_cpu_us_per_step'])
      if mode in ('cross', 'tls'):
        figures['cpu_us_per_step'] += figures['tunnel_cpu_us_per_step']
      measured[mode].append(figures)
      said = isolation_said(run.workdir) if mode in EXPECTED_ISOLATION else None
      runs.append({'env': row['env'], 'actors': actors, 'K': k, 'mode': mode, 'round': rnd,
                   'per_s': rate, 'exit': result['exit_code'], 'isolation': said,
                   'load_before': load_before, 'load_after': loads(),
                   'wall_s': round(result['wall_s'], 1), 'steady_s': round(steady_s, 1),
                   'cpu_us_per_step': figures['cpu_us_per_step']})
      print(f'acting: {env} {actors}x{k} {mode} (round {rnd}): {rate:,.0f} '
            f'{"frames" if env == "atari" else "steps"}/s (exit {result["exit_code"]}, '
            f'isolation {said or "-"}, load {load_before[0]:.1f} -> {loads()[0]:.1f}, '
            f'{time.monotonic() - started:.0f}s, logdir {run.logdir})', flush=True)
    for mode, per_run in measured.items():
      if not per_run:
        continue
      for key in per_run[0]:  # one run: its figures; several: medians (worst exit, load)
        values = [f[key] for f in per_run]
        row[f'{mode}_{key}'] = (values[0] if len(values) == 1 else
                                max(values, key=abs) if key == 'exit' else
                                max(values) if key == 'load_1m' else median(values))
      if len(per_run) > 1:
        rates = [f['per_s'] for f in per_run]
        row[f'{mode}_runs'] = rates
        finite = [r for r in rates if r == r]
        row[f'{mode}_spread'] = ((max(finite) - min(finite)) / row[f'{mode}_per_s']
                                 if finite and row[f'{mode}_per_s'] > 0 else float('nan'))
      if mode in EXPECTED_ISOLATION:
        said = sorted({str(r['isolation']) for r in runs if r['mode'] == mode and
                       (r['env'], r['actors'], r['K']) == (row['env'], actors, k)})
        row[f'{mode}_isolation'] = ','.join(said)
    row['ceiling_per_s'] = env_ceiling(env, actors, k, seconds=3.0 if args.quick else 8.0,
                                       engine=engine) * FRAMES_PER_STEP[env]
    ran = [m for m, _ in modes if f'{m}_per_s' in row]
    for mode in ran:
      row[f'{mode}_of_ceiling'] = row[f'{mode}_per_s'] / row['ceiling_per_s']
    for a, b in (('central', 'actor'), ('shm', 'actor'), ('shm', 'central'),
                 ('cross', 'central'), ('cross', 'shm'), ('tls', 'cross'),
                 ('central_loopback', 'central'), ('shm_loopback', 'shm')):
      if a in ran and b in ran:  # None where a mode measured no steps (nothing to compare)
        row[f'{a}_vs_{b}'] = (row[f'{a}_per_s'] / row[f'{b}_per_s']
                              if row[f'{b}_per_s'] > 0 else None)
        if args.repeats > 1:  # round by round (the two ran next to each other): drift cancels
          pairs = zip(measured[a], measured[b])
          row[f'{a}_vs_{b}_paired'] = median([x['per_s'] / y['per_s'] for x, y in pairs
                                              if y['per_s'] > 0])
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
  if any(m in dict(LOOPBACK) for m, _ in modes):
    print('\nIssue 64: servers on loopback through the interposer (`--network loopback`) '
          'against the private namespace; medians of --repeats runs, spread = (max - min) '
          '/ median')
    columns = []
    for mode, _ in LOOPBACK:  # namespace, loopback, their ratio, each one's spread
      base = mode[:-len('_loopback')]
      if mode in dict(modes):
        columns += [f'{base}_per_s', f'{mode}_per_s', f'{mode}_vs_{base}',
                    f'{mode}_vs_{base}_paired', f'{base}_spread', f'{mode}_spread']
    print_table(rows, ['env', 'actors', 'K', *columns])
  load_1m = [v for r in runs for v in (r['load_before'][0], r['load_after'][0])]
  payload = {'command': ' '.join(['bench/acting.py', *sys.argv[1:]]), **commit(),
             'machine': machine(), 'seconds_per_run': seconds, 'repeats': args.repeats,
             'modes': [m for m, _ in modes],
             'load': {'at_start': load_at_start, 'at_end': loads(),
                      'runs_1m': [min(load_1m), max(load_1m)] if load_1m else None},
             'rows': rows, 'runs': runs}
  path = write_json(args.out or ('acting_quick.json' if args.quick else 'acting.json'),
                    payload)
  print(f'acting: wrote {path}')
  wrong = [r for r in runs if r['mode'] in EXPECTED_ISOLATION
           and r['isolation'] != EXPECTED_ISOLATION[r['mode']]]
  for r in wrong:
    print(f"acting: {r['env']} {r['actors']}x{r['K']} {r['mode']} ran with isolation "
          f"{r['isolation']}, not {EXPECTED_ISOLATION[r['mode']]}", flush=True)
  failed = [r for r in runs if r['exit']]
  return 1 if failed or wrong else 0


if __name__ == '__main__':
  sys.exit(main())
