"""How much of the learner's speed alone a replay agent keeps inside the program.

    .venv/bin/python bench/learner_share.py --agent sac --seconds 150 \\
        --variant baseline= --variant sgd4='--agent_config sgd_steps_per_sample=4'
    .venv/bin/python bench/learner_share.py --agent r2d2 --seconds 90 \\
        --variant baseline= --variant nice10='--acting_nice 10'
    .venv/bin/python bench/learner_share.py --agent r2d2 --env atari --seconds 240 \\
        --variant auto= --variant xla='--setenv SEEDACME_INFERENCE_XLA=1'

On 2 cores the central node's learner shares the CPU with inference, the actors' envs and
the replay server. Each variant is one real program (`run_local <env> <agent> ...` plus
the variant's arguments) run for `--seconds`; from its progress records and every node's
CPU time this reports, over the steady window (from the first learner step + 10 s to the
end): learner steps/s, env steps/s, CPU cores used per node group, and the learner's
steps/s against the same step alone (`bench/learner_speed.py`'s child: the step on a
fixed in-memory batch, nothing else running, same config overrides). Variants run in
two rounds in opposite orders (AB, BA) so drift in the load favours none. A variant's
`--setenv VAR=VALUE` goes into its program's environment instead of run_local's
arguments. Writes bench/results/learner_share_<agent>[_<env>].json.

What a variant cannot show here is time to solve: `bench/time_to_solve.py` (CartPole) and
`bench/mujoco_learning.py` (returns per env step) are the judges; this bench explains them.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np

import harness

# (agent, env) -> (env and its arguments, actors, envs per actor, learner_speed batch);
# the first env of an agent is its default.
PROGRAMS = {
    ('sac', 'mujoco'): (['mujoco', '--level', 'HalfCheetah-v5'], 2, 4, 256),
    ('r2d2', 'cartpole'): (['cartpole'], 2, 16, 32),
    ('r2d2', 'atari'): (['atari', '--game', 'Pong', '--env_engine', 'vector_sync'], 2, 16,
                        16),
}
AGENTS = sorted({agent for agent, _ in PROGRAMS})
GROUPS = ('actor', 'evaluator', 'learner', 'replay')


def alone(agent: str, batch_size: int, overrides: Dict[str, Any], seconds: float,
          env_name: str = 'cartpole', setenv: Dict[str, str] | None = None) -> float:
  """Gradient steps/s of the learner step alone (learner_speed's child, this config)."""
  env = dict(os.environ, PYTHONPATH=harness.REPO, TF_CPP_MIN_LOG_LEVEL='2', **(setenv or {}))
  code = ('import sys, json; sys.path.insert(0, "bench"); import learner_speed as ls; '
          f'ls.VARIANTS["_x"] = ({{}}, {overrides!r}, None); '
          f'ls._child(type("A", (), dict(variant="_x", agent={agent!r}, '
          f'batch_size={batch_size}, seconds={seconds}, env={env_name!r}))())')
  out = subprocess.run([sys.executable, '-c', code], env=env, cwd=harness.REPO,
                       capture_output=True, text=True, timeout=seconds + 300, check=False)
  lines = [ln for ln in out.stdout.splitlines() if ln.startswith('{')]
  if out.returncode != 0 or not lines:
    raise RuntimeError(f'learner alone failed ({out.returncode}): {out.stderr[-2000:]}')
  result = json.loads(lines[-1])
  return result['sgd_steps_per_s']


def agent_overrides(args: List[str]) -> Dict[str, Any]:
  """The `--agent_config FIELD=VALUE` pairs of a variant's arguments."""
  from launchers.program_flags import parse_overrides  # pylint: disable=g-import-not-at-top
  items = [a.split('=', 1)[1] for a in args if a.startswith('--agent_config=')]
  items += [b for a, b in zip(args, args[1:]) if a == '--agent_config']
  return parse_overrides(items)


def _pop(args: List[str], flag: str, default: int) -> int:
  """Removes `flag VALUE` from `args` (the bench's own per-variant sizes)."""
  if flag not in args:
    return default
  i = args.index(flag)
  value = int(args[i + 1])
  del args[i:i + 2]
  return value


def setenv_of(args: List[str]) -> Dict[str, str]:
  """Removes every `--setenv VAR=VALUE` from `args`; returns them as a dict."""
  found = {}
  while '--setenv' in args:
    i = args.index('--setenv')
    var, sep, value = args[i + 1].partition('=') if i + 1 < len(args) else ('', '', '')
    if not var or not sep:
      raise SystemExit(f'learner_share: --setenv takes VAR=VALUE, got {args[i + 1:i + 2]}')
    found[var] = value
    del args[i:i + 2]
  return found


def run_variant(program: tuple, name: str, extra: List[str],
                seconds: float) -> Dict[str, Any]:
  agent, env_name = program
  env_args, actors, envs_per_actor, _ = PROGRAMS[program]
  extra = list(extra)
  actors = _pop(extra, '--actors', actors)
  envs_per_actor = _pop(extra, '--envs_per_actor', envs_per_actor)
  setenv = setenv_of(extra)
  run = harness.ProgramRun([env_args[0], agent, str(actors), str(envs_per_actor),
                            *env_args[1:], '--max_seconds', str(seconds), *extra],
                           f'share_{agent}_{env_name}_{name}', env=setenv)
  out = run.run(timeout_s=seconds + 240)
  learning = [r for r in run.records if r.get('learner_steps')]
  if len(learning) < 2:
    raise RuntimeError(f'{name}: no learner steps ({out["summary"].get("stop")})')
  t0 = learning[0]['elapsed_s'] + 10.0
  window = [r for r in learning if r['elapsed_s'] >= t0][:-1] or learning
  first, last = window[0], window[-1]
  dt = last['elapsed_s'] - first['elapsed_s']
  cpu = {}
  samples = [s for s in run.cpu_samples if first['elapsed_s'] <= s[0] <= last['elapsed_s']]
  if len(samples) >= 2 and samples[-1][1] > samples[0][1]:
    span = samples[-1][1] - samples[0][1]
    for group in GROUPS:
      used = sum(v - samples[0][2].get(n, 0.0) for n, v in samples[-1][2].items()
                 if n.split('/')[0] == group)
      cpu[group] = used / span
  return {'variant': name, 'args': extra, 'setenv': setenv, 'actors': actors,
          'envs_per_actor': envs_per_actor, 'window_s': dt,
          'learner_steps_per_s': (last['learner_steps'] - first['learner_steps']) / dt,
          'env_steps_per_s': (last['env_steps'] - first['env_steps']) / dt,
          'cpu_cores': cpu, 'load_1m_at_end': out['load_1m_at_end'],
          'exit_code': out['exit_code'], 'leftovers': out['leftovers']}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--agent', choices=AGENTS, default='sac')
  parser.add_argument('--env', default=None, help="the agent's program's env (default: "
                      "its first in PROGRAMS): " + ', '.join(f'{a}:{e}' for a, e in PROGRAMS))
  parser.add_argument('--variant', action='append', default=[], metavar='NAME=ARGS',
                      help='a name and the run_local arguments it adds (repeatable); '
                      '--actors N and --envs_per_actor N among them resize the program')
  parser.add_argument('--seconds', type=float, default=150.0, help='per program')
  parser.add_argument('--alone_seconds', type=float, default=15.0)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  variants = [(v.split('=', 1)[0], shlex.split(v.split('=', 1)[1] if '=' in v else ''))
              for v in (args.variant or ['baseline='])]
  default_env = next(e for a, e in PROGRAMS if a == args.agent)
  program = (args.agent, args.env or default_env)
  if program not in PROGRAMS:
    parser.error(f'no program for {program[0]} on {program[1]}: one of '
                 + ', '.join(f'{a}:{e}' for a, e in PROGRAMS))
  batch = PROGRAMS[program][3]
  load_before = os.getloadavg()[0]
  runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name, _ in variants}
  for r in range(args.rounds):
    for name, extra in (variants if r % 2 == 0 else variants[::-1]):
      res = run_variant(program, name, extra, args.seconds)
      runs[name].append(res)
      print(f'  round {r + 1}: {name:<16} learner {res["learner_steps_per_s"]:6.1f}/s, '
            f'env {res["env_steps_per_s"]:7.1f}/s, cpu '
            + ' '.join(f'{g} {c:.2f}' for g, c in res['cpu_cores'].items())
            + f' (load {res["load_1m_at_end"]:.1f})', flush=True)
  rows = []
  for name, extra in variants:
    overrides = agent_overrides(extra)
    alone_rate = alone(args.agent, batch, overrides, args.alone_seconds, program[1],
                       runs[name][0]['setenv'])
    med = lambda key, rs=runs[name]: float(np.median([x[key] for x in rs]))  # noqa: E731
    cpu = {g: float(np.median([x['cpu_cores'].get(g, np.nan) for x in runs[name]]))
           for g in GROUPS}
    rows.append({'variant': name, 'learner_steps/s': med('learner_steps_per_s'),
                 'alone_steps/s': alone_rate,
                 'share': med('learner_steps_per_s') / alone_rate,
                 'env_steps/s': med('env_steps_per_s'),
                 **{f'cpu_{g}': cpu[g] for g in GROUPS}, 'args': ' '.join(extra)})
  print(f'\n{args.agent}: {PROGRAMS[program][0]} {PROGRAMS[program][1]} actors x '
        f'{PROGRAMS[program][2]} envs, {args.seconds:.0f} s per program, '
        f'load {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end')
  harness.print_table(rows, ['variant', 'learner_steps/s', 'alone_steps/s', 'share',
                             'env_steps/s', *[f'cpu_{g}' for g in GROUPS]])
  out_name = f'learner_share_{args.agent}' + ('' if program[1] == default_env
                                               else f'_{program[1]}')
  path = harness.write_json(args.out or f'{out_name}.json', {
      'machine': harness.machine(), 'load_start': load_before,
      'load_end': os.getloadavg()[0], 'agent': args.agent, 'env': program[1],
      'program': PROGRAMS[program][:3], 'seconds': args.seconds, 'rows': rows,
      'runs': runs})
  print(f'wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
