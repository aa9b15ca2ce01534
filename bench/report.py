"""Turns the benchmark JSONs in bench/results/ into README tables and one figure.

    .venv/bin/python bench/report.py            # Markdown + bench/results/benchmarks.png
    .venv/bin/python bench/report.py --publish  # also copies the figure and the JSONs to
                                                # what the README shows (bench/benchmarks.png,
                                                # bench/published/)

    .venv/bin/python bench/report.py --before DIR
                                                # also before/after tables against the
                                                # JSONs in DIR (e.g. bench/published/, or
                                                # an older checkout's bench/results/)

Reads acting.json, inference_service.json and time_to_solve.json (whichever exist).
"""

import json
import os
import shutil
import sys
from typing import Any, Dict, List

from harness import RESULTS


def _load(name: str) -> Dict[str, Any] | None:
  path = os.path.join(RESULTS, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _fmt(v: Any, digits: int = 0) -> str:
  if v is None or (isinstance(v, float) and v != v):
    return '–'
  if isinstance(v, float):
    return f'{v:,.{digits}f}'
  return str(v)


def _table(header: List[str], rows: List[List[str]]) -> str:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
  return '\n'.join(lines)


def acting_table(data: Dict[str, Any]) -> str:
  rows = []
  for r in data['rows']:
    unit = 'frames/s' if r['env'] == 'pong' else 'steps/s'
    rows.append([r['env'], str(r['actors']), str(r['K']), unit, _fmt(r['central_per_s']),
                 _fmt(r['actor_per_s']), _fmt(r['central_vs_actor'], 2) + '×',
                 _fmt(r['ceiling_per_s']), _fmt(100 * r['central_of_ceiling']) + ' %',
                 _fmt(r['central_actor_rss_mb']), _fmt(r['actor_actor_rss_mb'])])
  return _table(['env', 'actors', 'K', 'unit', 'central', 'actor-side', 'ratio',
                 'raw env ceiling', 'central / ceiling', 'actor RSS MB (central)',
                 'actor RSS MB (actor-side)'], rows)


def service_table(data: Dict[str, Any]) -> str:
  rows = [[r['env'], str(r['clients']), str(r['K']), r['server'], r.get('batching', '–'),
           str(r.get('tf_threads', 'default')) + (' (XLA 1 thread)' if r.get('xla_flags')
                                                  else ''), _fmt(r['requests_per_s']),
           _fmt(r['env_steps_per_s']), _fmt(r['p50_ms'], 2), _fmt(r['p99_ms'], 2),
           _fmt(r['batch_fill'], 2), _fmt(100 * r['of_echo']) + ' %'] for r in data['rows']]
  return _table(['payload', 'clients', 'K', 'server', 'batching', 'TF threads',
                 'requests/s', 'env steps/s', 'p50 ms', 'p99 ms', 'batch fill', 'of echo'],
                rows)


def _default_rows(data: Dict[str, Any]) -> Dict[tuple, Dict[str, Any]]:
  """Service rows at the program's default settings, by (env, clients, K, server)."""
  return {(r['env'], r['clients'], r['K'], r['server']): r for r in data['rows']
          if r.get('batching', 'free') in ('free', '-') and
          r.get('tf_threads', 'default') == 'default' and not r.get('xla_flags')}


def service_before_after(before: Dict[str, Any], after: Dict[str, Any]) -> str:
  old, new = _default_rows(before), _default_rows(after)
  rows = []
  for key in [k for k in new if k in old and k[3] != 'echo']:
    b, a = old[key], new[key]
    rows.append([key[0], str(key[1]), str(key[2]), key[3], _fmt(b['requests_per_s']),
                 _fmt(a['requests_per_s']), _fmt(a['requests_per_s'] / b['requests_per_s'], 2)
                 + '×', _fmt(100 * b['of_echo']) + ' %', _fmt(100 * a['of_echo']) + ' %',
                 _fmt(b['p99_ms'], 2), _fmt(a['p99_ms'], 2)])
  return _table(['payload', 'clients', 'K', 'server', 'req/s before', 'req/s after',
                 'after / before', 'of echo before', 'of echo after', 'p99 ms before',
                 'p99 ms after'], rows)


def acting_before_after(before: Dict[str, Any], after: Dict[str, Any]) -> str:
  key = lambda r: (r['env'], r['actors'], r['K'])  # noqa: E731
  old = {key(r): r for r in before['rows']}
  rows = []
  for r in after['rows']:
    b = old.get(key(r))
    if b is None:
      continue
    rows.append([r['env'], str(r['actors']), str(r['K']), _fmt(b['central_per_s']),
                 _fmt(r['central_per_s']), _fmt(r['central_per_s'] / b['central_per_s'], 2)
                 + '×', _fmt(b['central_vs_actor'], 2) + '×',
                 _fmt(r['central_vs_actor'], 2) + '×'])
  return _table(['env', 'actors', 'K', 'central before', 'central after', 'after / before',
                 'central / actor-side before', 'central / actor-side after'], rows)


def solve_table(data: Dict[str, Any]) -> str:
  rows = []
  for r in data['rows']:
    rows.append([r['env'], r['agent'], f"2 × {r.get('K', 16)}",
                 r.get('target_on', 'eval'), r['inference'],
                 _fmt(r['time_to_target_s']) + ' s' if r['solved'] else 'not reached',
                 _fmt(r['env_steps']), _fmt(r['startup_to_first_learner_step_s']) + ' s',
                 _fmt(r['actor_rss_mb']), _fmt(r['evaluator_rss_mb']),
                 _fmt(r['learner_rss_mb']), _fmt(r['replay_rss_mb']),
                 _fmt(r['program_peak_rss_mb'])])
  return _table(['env', 'agent', 'actors × K', 'target on', 'inference', 'time to target',
                 'env steps',
                 'launch → 1st learner step', 'actor MB', 'evaluator MB', 'learner MB',
                 'replay MB', 'program MB'], rows)


def figure(acting: Dict[str, Any] | None, solve: Dict[str, Any] | None) -> str | None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = [p for p in (acting, solve) if p]
  if not panels:
    return None
  fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
  ax_i = 0
  if acting:
    ax = axes[0][ax_i]
    ax_i += 1
    rows = acting['rows']
    labels = [f"{r['env']}\n{r['actors']}×{r['K']}" for r in rows]
    x = range(len(rows))
    width = 0.27
    ax.bar([i - width for i in x], [r['central_of_ceiling'] * 100 for r in rows], width,
           label='central (SEED)')
    ax.bar(list(x), [r['actor_of_ceiling'] * 100 for r in rows], width,
           label='actor-side (Acme)')
    ax.axhline(100, color='gray', lw=0.8, ls='--')
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel('% of raw env ceiling (same envs, no inference)')
    ax.set_title('Acting throughput (actors × envs per actor)')
    ax.legend(fontsize=8)
  if solve:
    ax = axes[0][ax_i]
    rows = solve['rows']
    runs = sorted({(r['env'], r['agent'], r.get('K', 16)) for r in rows})
    x = range(len(runs))
    width = 0.38
    for offset, mode in ((-width / 2, 'central'), (width / 2, 'actor')):
      values = []
      for env, agent, k in runs:
        match = [r for r in rows if (r['env'], r['agent'], r.get('K', 16), r['inference']) ==
                 (env, agent, k, mode)]
        values.append(match[0]['time_to_target_s'] or 0 if match else 0)
      ax.bar([i + offset for i in x], values, width,
             label='central (SEED)' if mode == 'central' else 'actor-side (Acme)')
    ax.set_xticks(list(x))
    ax.set_xticklabels([f'{e}\n{a} 2×{k}' for e, a, k in runs], fontsize=8)
    ax.set_ylabel('seconds to target (0: not reached)')
    ax.set_title('Time to solve (2 actors × K envs)')
    ax.legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(RESULTS, 'benchmarks.png')
  fig.savefig(path, dpi=110)
  return path


def main() -> int:
  acting = _load('acting.json')
  service = _load('inference_service.json')
  solve = _load('time_to_solve.json')
  for data in (acting, service, solve):
    if data:
      print(f"Machine: {data['machine']}\n")
      break
  if acting:
    print('### Acting throughput\n\n' + acting_table(acting) + '\n')
  if service:
    print('### Inference service vs Courier echo\n\n' + service_table(service) + '\n')
  if solve:
    print('### Time to solve, startup, memory\n\n' + solve_table(solve) + '\n')
  if '--before' in sys.argv[1:]:
    before_dir = sys.argv[sys.argv.index('--before') + 1]
    for name, data, table in (('inference_service.json', service, service_before_after),
                              ('acting.json', acting, acting_before_after)):
      path = os.path.join(before_dir, name)
      if data and os.path.exists(path):
        with open(path) as f:
          print(f'### Before ({path}) / after: {name}\n\n' + table(json.load(f), data) + '\n')
  path = figure(acting, solve)
  if path:
    print(f'Figure: {path}')
  if '--publish' in sys.argv[1:]:
    bench = os.path.dirname(RESULTS)
    os.makedirs(os.path.join(bench, 'published'), exist_ok=True)
    for name in ('acting.json', 'inference_service.json', 'time_to_solve.json'):
      if os.path.exists(os.path.join(RESULTS, name)):
        shutil.copy(os.path.join(RESULTS, name), os.path.join(bench, 'published', name))
    if path:
      shutil.copy(path, os.path.join(bench, 'benchmarks.png'))
    print('Published to bench/benchmarks.png and bench/published/')
  return 0


if __name__ == '__main__':
  sys.exit(main())
