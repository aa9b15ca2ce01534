"""MuJoCo learning curves: agents trained by the real multi-process program, published.

    .venv/bin/python bench/mujoco_learning.py --runs HalfCheetah-v5:ppo:0 Hopper-v5:ppo:1
    .venv/bin/python bench/mujoco_learning.py --smoke   # one 30k-step run, under a minute

Each `task:agent:seed` is one `run_local mujoco <agent> <actors> <envs_per_actor> --level
<task> --max_env_steps <env_steps> --max_seconds <cap_s> --seed <seed>` (plus every
`--agent_config` and the arguments after `--`), one after the other, its logdir
bench/results/mujoco/<out>/<task>_<agent>_s<seed>/. Resumable: a run whose summary.json
reached the env-step budget (or diverged: it would resume into the same divergence) is
read back, not rerun; so is a finished run that bench/published/<out>.json holds, when
that file ran the same settings (env steps, actors, envs, overrides) and the logdir is
empty: its figures and curve come from the JSON, so a new checkout continues a study
without the run folders. Any other run is launched again on its logdir, and the central
node resumes it from <logdir>/checkpoints (saved every 60 s and at the end;
seedacme/nodes/central.py); its time budget counts over every start. So the same command
continues a session that was stopped or capped; a study with other overrides needs its
own `--out`. A stopped run resumes in another checkout only from its folder: keep it
with bench/keep_run.py (outside the checkout) and copy it back to its logdir first.

Per run: its launches (command, date, load, exit, and the machine's CPU and cores: a
continued study may span machines), env steps, wall and run time, the training average
(last 100 episodes) at the end with the episodes it covers (fewer than 100 when a resume
near the end left too little time to refill the window) and its best over full windows,
the evaluator's at the end, the training average at 100k/300k/500k/1M env steps (first
record at or past the mark averaging a full window; null if not reached), env and
learner steps/s over the whole run (all segments, startup included), mean policy lag,
command, stop reason, and what it ran with: `agent_config_full` (the agent's config
dataclass after the registry's defaults and the overrides) and `env_config_full` (the
training envs' options, the agent's training-env defaults included), from the run's
saved run_config.json, else resolved from its arguments by the launcher's code
(`harness.run_configs`). Writes bench/results/<out>.json (machine, commit, load_1m,
command, runs, curves: each run's full-window training averages as recorded,
seed_curves: each run's training and evaluator averages at fixed env-step points,
summary: per task and agent the seeds' median returns at 1M and 300k, and the median of
their final averages) and <out>.png (a panel per task), then (not with --smoke) copies
both to bench/published/: a published result is that one JSON and its picture. It does
not copy them when that would lose runs the published JSON holds (`publish_refusal`:
interrupted, a run with no result, or a run the published file holds that --runs does
not list); it says why and exits 1.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List

import harness

from seedacme.launchers import process
from seedacme.run import logdir as logdir_lib
from seedacme.run import curves as curves_lib
from seedacme.run.curves import curve_step, full_windows, published_curve

MARKS = {'100k': 100_000, '300k': 300_000, '500k': 500_000, '1M': 1_000_000}
GRACE_S = 180.0  # past --max_seconds: startup, the last checkpoint and the shutdown
RUN_FILE = 'bench_run.json'  # in each logdir: how this bench launched the run
PUBLISHED = os.path.join(harness.REPO, 'bench', 'published')
# The settings a published study must share with this command for its runs to be read
# back from it (`--cap_s` may grow between sessions: it is not among them).
SAME_STUDY = ('env_steps', 'actors', 'envs_per_actor', 'agent_config', 'passthrough')


def rel(path: str) -> str:
  return os.path.relpath(path, harness.REPO)


def run_name(spec: str) -> str:
  """`task:agent:seed` -> the run's name (its logdir and its key in the JSON)."""
  task, agent, seed = spec.split(':')
  return f'{task}_{agent}_s{seed}'


def launch(cmd: List[str], logdir: str, cap_s: float,
           agent_config: List[str]) -> Dict[str, Any]:
  """Runs one program to its end; SIGINT to its process group past `cap_s + GRACE_S`
  or on Ctrl-C (the launcher then stops its nodes and writes the summary)."""
  tag, load_before = uuid.uuid4().hex, os.getloadavg()[0]
  date, start, interrupted = time.strftime('%Y-%m-%d %H:%M'), time.monotonic(), False
  with open(os.path.join(logdir, 'bench_stdout.txt'), 'a') as out:
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=harness.REPO,
                            env=dict(os.environ, **{harness.TAG_VAR: tag}),
                            start_new_session=True)
    try:
      code = proc.wait(cap_s + GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
      interrupted = isinstance(e, KeyboardInterrupt)
      os.killpg(proc.pid, signal.SIGINT)
      try:
        code = proc.wait(90)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
  for p in harness.tagged_processes(tag):  # nodes a killed launcher left behind
    p.kill()
  return {'command': ' '.join([rel(cmd[0]), *cmd[1:]]), 'date': date, 'exit_code': code,
          'wall_s': time.monotonic() - start, 'load_1m_before': load_before,
          'load_1m_after': os.getloadavg()[0], 'interrupted': interrupted,
          'agent_config': agent_config,
          # Per launch: a study continued in a later session may run on another machine
          # (results say which machine they ran on: docs/history.md).
          'machine': {k: harness.machine()[k] for k in ('cpu', 'cores')}}


def round_records(logdir: str) -> List[Dict[str, Any]]:
  """A `--reproducible` run's round records (rounds.jsonl: the same in every run of its
  seed, where progress records fall on the clock), shaped as progress records for the
  curve functions (`elapsed_s`: the round; `eval_average_return`: the evaluator's pass
  that played the round's weights, evals.jsonl); [] for any other run."""
  path = os.path.join(logdir, 'rounds.jsonl')
  if not os.path.isfile(path):
    return []
  evals = {}  # round -> the evaluator's average of the pass that played its weights
  if os.path.isfile(os.path.join(logdir, 'evals.jsonl')):
    with open(os.path.join(logdir, 'evals.jsonl')) as f:
      evals = {p['round']: p['average_return'] for p in map(json.loads, f)}
  with open(path) as f:
    return [dict(r, elapsed_s=float(r['round']), eval_average_return=evals.get(r['round']))
            for r in map(json.loads, f)]


def analyse(records: List[Dict[str, Any]], summary: Dict[str, Any] | None,
            rounds: List[Dict[str, Any]] | None = None) -> 'tuple[Dict[str, Any], list]':
  """The figures of one run from its progress records (every segment) and summary, and
  its curve: [env steps, training average] where the average covers a full window. A
  reproducible run's returns and curve come from its `rounds` instead (exact)."""
  segments = [r['elapsed_s'] for r, nxt in zip(records, records[1:] + [None])
              if nxt is None or nxt['elapsed_s'] < r['elapsed_s']]  # a resume restarts it
  if summary and segments:
    segments[-1] = max(segments[-1], summary['elapsed_s'])
  run_s = sum(segments) or (summary or {}).get('elapsed_s') or 0.0
  final = summary or (records[-1] if records else {})
  curve_records = rounds or records
  trained = [r for r, ok in zip(curve_records, full_windows(curve_records))
             if ok and r.get('average_return') is not None]
  lags = [r['learner_policy_lag'] for r in records if r.get('learner_policy_lag') is not None]
  env_steps = final.get('env_steps') or 0
  return {
      'env_steps': env_steps, 'run_s': run_s, 'segments': len(segments),
      'final_average_return': final.get('average_return'),
      'final_average_over': final.get('average_over'),
      'best_average_return': max((r['average_return'] for r in trained), default=None),
      'eval_return_at_end': final.get('eval_average_return'),
      **{f'return_at_{k}': next((r['average_return'] for r in trained
                                 if r['env_steps'] >= mark), None)
         for k, mark in MARKS.items()},
      'env_steps_per_s': env_steps / run_s if run_s else None,
      'learner_steps_per_s': (final.get('learner_steps') or 0) / run_s if run_s else None,
      # A mean over progress records (the published field); `learner_means` counts
      # each learner step once (as the Pong bench does).
      'mean_policy_lag': statistics.fmean(lags) if lags else None,
      'learner_means': harness.learner_means(records),
      'stopped_because': summary['stopped_because'] if summary else 'no summary',
      'stop_kind': ((summary or {}).get('stop') or {}).get('kind'),
      # A reproducible run: its weights, how far it is exact, what it pinned.
      **{k: (summary or {}).get(k) for k in (
          'reproducible', 'weights_sha256', 'exact_until_round', 'not_exact_because',
          'reproducible_machine') if (summary or {}).get('reproducible')},
  }, [[r['env_steps'], r['average_return']] for r in trained]


def summarize(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Per (task, agent): the median over seeds of the returns at 1M and 300k env steps
  (full windows only), and of the final training averages with the fewest episodes any
  of them covers (a run resumed near its end refills its window: fewer than 100)."""
  out = []
  for task, agent in dict.fromkeys((r['task'], r['agent']) for r in rows):
    runs = [r for r in rows if (r['task'], r['agent']) == (task, agent)]
    row = {'task': task, 'agent': agent, 'seeds': len(runs)}
    for k in ('1M', '300k'):
      values = [r[f'return_at_{k}'] for r in runs if r[f'return_at_{k}'] is not None]
      row[f'median_return_at_{k}'] = statistics.median(values) if values else None
      row[f'seeds_reaching_{k}'] = len(values)
    finals = [r for r in runs if r['final_average_return'] is not None]
    row['median_final_average_return'] = (
        statistics.median(r['final_average_return'] for r in finals) if finals else None)
    overs = [r['final_average_over'] for r in finals if r.get('final_average_over') is not None]
    row['min_final_average_over'] = min(overs) if overs else None
    out.append(row)
  return out


def published_run(out: str, name: str, settings: Dict[str, Any],
                  env_steps: int) -> Dict[str, Any] | None:
  """Run `name` of bench/published/<out>.json if that study ran `settings` and the run
  finished (reached `env_steps` or diverged): its row, curve, sampled curve and load."""
  path = os.path.join(PUBLISHED, f'{out}.json')
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    study = json.load(f)
  if any(study.get('settings', {}).get(k) != settings[k] for k in SAME_STUDY):
    return None
  row = next((r for r in study.get('runs', []) if r['name'] == name), None)
  if row is None or not (row['env_steps'] >= env_steps or row.get('stop_kind') == 'diverged'):
    return None
  sampled = next((c for c in study.get('seed_curves', {}).get('runs', [])
                  if c['name'] == name), None)
  return {'row': row, 'curve': study.get('curves', {}).get(name, []), 'sampled': sampled,
          'load_1m': study.get('load_1m', {}).get(name)}


def publish_refusal(out: str, rows: List[Dict[str, Any]], requested: List[str],
                    interrupted: bool) -> str | None:
  """Why this invocation must not replace bench/published/<out>.json, or None.

  A published study is read back by later invocations, so replacing it with less than
  it holds loses runs: an interrupted study has a partial run and misses the runs after
  it, and a command listing fewer runs than the published file would drop the others.
  """
  if interrupted:
    return 'interrupted before every run finished'
  have = {r['name'] for r in rows}
  missing = [name for name in requested if name not in have]
  if missing:
    return 'runs with no result: ' + ', '.join(missing)
  path = os.path.join(PUBLISHED, f'{out}.json')
  if os.path.isfile(path):
    with open(path) as f:
      held = [r['name'] for r in json.load(f).get('runs', [])]
    dropped = [name for name in held if name not in requested]
    if dropped:
      return (f'{rel(path)} also holds {", ".join(dropped)}: list them in --runs too '
              '(finished runs are read back, not rerun)')
  return None


def seed_curves(rows: List[Dict[str, Any]], every: int,
                sampled: Dict[str, Dict[str, list]]) -> Dict[str, Any]:
  """The published per-seed curves: each run's averages every `every` env steps."""
  return curves_lib.seed_curves(every, [
      {k: r[k] for k in ('name', 'task', 'agent', 'seed')}
      | {k: v for k, v in (sampled.get(r['name']) or {}).items()
         if k in ('env_steps', 'average_return', 'eval_return')} for r in rows])


def plot(path: str, rows: List[Dict[str, Any]], curves: Dict[str, list],
         records: Dict[str, list]) -> None:
  """One panel per task, one line per (agent, seed); a resumed segment's averages over
  fewer than 100 episodes (its window refilling) dotted in the same colour, so a run
  resumed near its end still shows where it ended."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  tasks = sorted({r['task'] for r in rows})
  fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    for r in (r for r in rows if r['task'] == task and curves[r['name']]):
      line, = ax.plot(*zip(*curves[r['name']]), label=f"{r['agent']} seed {r['seed']}")
      runs = records[r['name']]
      partial = [(x['env_steps'], x['average_return'])
                 for x, ok in zip(runs, full_windows(runs))
                 if not ok and x.get('average_return') is not None]
      if partial:
        ax.plot(*zip(*partial), ':', color=line.get_color(),
                label=f"{r['agent']} seed {r['seed']}, resumed (window < 100)")
    ax.set(title=task, xlabel='env steps', ylabel='training average return (last 100)')
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main() -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      epilog='Arguments after -- are passed to every run_local unchanged.')
  parser.add_argument('--runs', nargs='+', default=['HalfCheetah-v5:ppo:0', 'Hopper-v5:ppo:0'],
                      metavar='TASK:AGENT:SEED')
  parser.add_argument('--env_steps', type=int, default=1_000_000, help='budget per run')
  parser.add_argument('--actors', type=int, default=2)
  parser.add_argument('--envs_per_actor', type=int, default=8)
  parser.add_argument('--cap_s', type=float, default=1800.0,
                      help="the run's time budget (--max_seconds), which counts over "
                      'every start of the run: a resumed run needs its total, not what is '
                      'left; also the wall-clock cap of each launch')
  parser.add_argument('--agent_config', action='append', default=[], metavar='FIELD=VALUE')
  parser.add_argument('--out', default='mujoco_learning', help='name of the outputs')
  parser.add_argument('--smoke', action='store_true', help='one 30k-step run, 60 s cap')
  argv, passthrough = harness.split_passthrough(sys.argv[1:])
  args = parser.parse_args(argv)
  harness.interrupt_on_stop_signals()
  if args.smoke:
    args.env_steps, args.cap_s, args.out = 30_000, 60.0, 'mujoco_learning_smoke'
    args.runs = ['HalfCheetah-v5:ppo:0']
  base = os.path.join(harness.RESULTS, 'mujoco', args.out)
  settings = {**{k: getattr(args, k) for k in ('env_steps', 'actors', 'envs_per_actor',
              'cap_s', 'agent_config')}, 'passthrough': passthrough}
  every = curve_step(args.env_steps)
  rows, curves, records, load_1m, sampled = [], {}, {}, {}, {}
  interrupted = False
  for spec in args.runs:
    task, agent, seed = spec.split(':')
    logdir = os.path.join(base, name := run_name(spec))
    fresh = not os.path.isfile(os.path.join(logdir, 'progress.jsonl'))
    kept = (fresh and not args.smoke and
            published_run(args.out, name, settings, args.env_steps))
    if kept:  # finished and published, no run folder here: read back from the JSON
      rows.append({**kept['row'], 'read_back': 'bench/published'})
      curves[name], records[name], load_1m[name] = kept['curve'], [], kept['load_1m']
      sampled[name] = kept['sampled'] or {}
      print(f'mujoco_learning: {name} read back from bench/published/{args.out}.json',
            flush=True)
      continue
    os.makedirs(logdir, exist_ok=True)
    meta, meta_path = {'launches': []}, os.path.join(logdir, RUN_FILE)
    if os.path.exists(meta_path):
      with open(meta_path) as f:
        meta = json.load(f)
    summary = logdir_lib.read_summary(logdir)
    done = bool(summary) and (summary.get('env_steps', 0) >= args.env_steps or
                              (summary.get('stop') or {}).get('kind') == 'diverged')
    run_args = ['mujoco', agent, str(args.actors), str(args.envs_per_actor), '--level', task,
                '--max_env_steps', str(args.env_steps), '--max_seconds', str(args.cap_s),
                '--seed', seed, *[f'--agent_config={c}' for c in args.agent_config],
                *passthrough]
    if not done:
      if fresh:
        print(f'mujoco_learning: {name}: nothing in {rel(logdir)}, starting afresh (a run '
              'kept with bench/keep_run.py resumes once copied back there)', flush=True)
      cmd = process.command(run_args, rel(logdir))
      print(f'mujoco_learning: {name}: ' + ' '.join(cmd[1:]), flush=True)
      try:
        meta['launches'].append(launch(cmd, logdir, args.cap_s, args.agent_config))
      finally:
        with open(meta_path, 'w') as f:
          json.dump(meta, f, indent=1)
      summary = logdir_lib.read_summary(logdir)
    records[name] = logdir_lib.read_progress(logdir)
    rounds = round_records(logdir)
    figures, curves[name] = analyse(records[name], summary, rounds)
    sampled[name] = published_curve(rounds or records[name], every)
    last = meta['launches'][-1] if meta['launches'] else {}
    load_1m[name] = {'before': last.get('load_1m_before'), 'after': last.get('load_1m_after')}
    rows.append({'name': name, 'task': task, 'agent': agent, 'seed': int(seed),
                 'logdir': rel(logdir), 'read_back': done,
                 'wall_s': sum(x['wall_s'] for x in meta['launches']) or None,
                 **figures, 'agent_config': last.get('agent_config'),
                 **harness.run_configs(run_args, logdir),
                 'command': last.get('command'), 'launches': meta['launches']})
    r = rows[-1]
    print(f"mujoco_learning: {name} {'read back' if done else 'finished'}: "
          f"{r['env_steps']:,} env steps in {r['run_s']:.0f}s ({r['stopped_because']}); "
          + ', '.join(f"{k} {'-' if r[k] is None else round(r[k], 1)}" for k in
                      ('final_average_return', 'best_average_return', 'eval_return_at_end')),
          flush=True)
    if not done and meta['launches'][-1]['interrupted']:
      print('mujoco_learning: interrupted: the runs after this one are not started')
      interrupted = True
      break
  payload = {
      'machine': harness.machine(), **harness.commit(),
      'command': ' '.join([rel(sys.executable), rel(os.path.abspath(__file__)), *sys.argv[1:]]),
      'settings': settings, 'load_1m': load_1m, 'runs': rows, 'curves': curves,
      'seed_curves': seed_curves(rows, every, sampled), 'summary': summarize(rows)}
  paths = [harness.write_json(f'{args.out}.json', payload),
           os.path.join(harness.RESULTS, f'{args.out}.png')]
  plot(paths[1], rows, curves, records)
  refusal = None if args.smoke else publish_refusal(
      args.out, rows, [run_name(spec) for spec in args.runs], interrupted)
  if not args.smoke and refusal is None:  # bench/results, then copied to bench/published
    paths = [shutil.copy(p, PUBLISHED) for p in paths]
  print()
  harness.print_table(rows, ['task', 'agent', 'seed', 'env_steps', 'wall_s', 'stop_kind',
      'final_average_return', 'final_average_over', 'best_average_return',
      'eval_return_at_end', 'return_at_300k', 'return_at_1M', 'env_steps_per_s',
      'learner_steps_per_s', 'mean_policy_lag'])
  print()
  harness.print_table(payload['summary'], [*payload['summary'][0]])
  print('mujoco_learning: wrote ' + ', '.join(rel(p) for p in paths))
  if refusal:
    print(f'mujoco_learning: not published ({refusal}); bench/published/{args.out}.json '
          'is unchanged')
  return 1 if refusal or any(r['stop_kind'] is None for r in rows) else 0


if __name__ == '__main__':
  sys.exit(main())
