"""The README's one-liners run what the published runs they cite ran (issue 36, item 5).

A README command that ends in `-> bench/published/X.json` claims to reproduce that run.
Each is resolved as `run_local` would resolve it -- the launcher's own parser and
`program_flags.resolved_run` (registry defaults, the fit to the program's size, the
flags), not a copy -- and compared, field by field, with the published run of the same
env, agent and task: its recorded `agent_config_full` / `env_config_full` where it has
them, else its own command resolved the same way with today's registry (runs published
before the full config was recorded), plus actors and envs per actor. Budgets, seeds and
logdirs may differ. A field only one side has (added or removed by a code change since)
is not compared, as on resume (`seedacme.run.identity`).

A cited file that does not exist fails, except the ones named in `PENDING` (being run
now), which skip saying why.
"""

import json
import os
import re
import shlex
from typing import Any, Dict, List

import pytest

from seedacme.agents import registry
from seedacme.launchers import local, program_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, 'README.md')
LINE = re.compile(r'^scripts/run_local\s+(?P<args>[^#]*?)\s*#.*?->\s*'
                  r'(?P<path>bench/published/[\w.-]+\.json)\s*$')
# Cited before they exist: the file, and why it is missing.
PENDING: Dict[str, str] = {}  # cited file -> why it is not published yet


def readme_rows() -> List[Dict[str, Any]]:
  """Every README line `scripts/run_local ... # ... -> bench/published/X.json`."""
  with open(README) as f:
    lines = f.read().splitlines()
  return [{'line': n, 'args': shlex.split(m['args']), 'path': m['path']}
          for n, m in ((n, LINE.match(text)) for n, text in enumerate(lines, 1)) if m]


def run_local_args(command: str) -> List[str]:
  """The `run_local` arguments of a published command line (the first command when it
  records resumes after ' ; ')."""
  argv = shlex.split(command.split(' ; ')[0])
  return argv[argv.index('seedacme.launchers.local') + 1:]


def resolve(argv: List[str]) -> Dict[str, Any]:
  """What `run_local argv` runs with: agent config, training-env options, program size."""
  args = local.parse_args(argv)
  return {**program_flags.resolved_run(args),
          'program': {'num_actors': args.num_actors, 'envs_per_actor': args.envs_per_actor}}


def task(argv: List[str]) -> tuple:
  args = local.parse_args(argv)
  return args.env, args.agent, args.level, args.game, args.scenario


def published(path: str, argv: List[str]) -> List[Dict[str, Any]]:
  """The config of each published run in `path` of the same env, agent and task as
  `argv`: recorded where the file has it, else its command resolved. `path` is
  relative to the repository (or absolute)."""
  with open(os.path.join(REPO, path)) as f:
    data = json.load(f)
  out = []
  for record in data.get('runs', [data]):
    theirs = run_local_args(record['command'])
    if task(theirs) != task(argv):
      continue
    config = resolve(theirs)
    for key in ('agent_config_full', 'env_config_full'):
      if record.get(key) is not None:
        config[key] = record[key]
    out.append({'name': record.get('name', path), 'config': config,
                'recorded': 'agent_config_full' in record})
  return out


def differences(ours: Dict[str, Any], theirs: Dict[str, Any]) -> List[str]:
  """'section.field: README value, published value' for every field both set apart."""
  return [f'{section}.{key}: README {ours[section][key]!r}, published '
          f'{theirs[section][key]!r}'
          for section in ('agent_config_full', 'env_config_full', 'program')
          for key in sorted(ours[section].keys() & theirs[section].keys())
          if ours[section][key] != theirs[section][key]
          and (section, key) != ('agent_config_full', 'seed')]  # `--seed` sets it


def check_row(row: Dict[str, Any]) -> List[str]:
  """Every difference between README line `row` and the runs it cites, by run."""
  runs = published(row['path'], row['args'])
  assert runs, (f'README line {row["line"]}: {row["path"]} has no run of '
                f'{" ".join(row["args"][:2])} on {task(row["args"])[2:]}')
  ours = resolve(row['args'])
  return [f'{run["name"]}: {d}' for run in runs for d in differences(ours, run['config'])]


ROWS = readme_rows()


def test_every_cited_published_run_is_parsed():
  """A citation the pattern misses would go unchecked: every README line naming a
  published JSON after a run_local command must parse, and the known ones be there."""
  with open(README) as f:
    cited = [n for n, text in enumerate(f.read().splitlines(), 1)
             if text.startswith('scripts/run_local') and 'bench/published/' in text]
  assert sorted(r['line'] for r in ROWS) == cited
  assert {r['path'] for r in ROWS} >= {
      'bench/published/mujoco_ppo_walker2d_reproducible.json',
      'bench/published/mujoco_learning_sac.json', 'bench/published/pong_learning_ppo_e3_s2.json',
      'bench/published/pong_learning_r2d2_b8.json'}


@pytest.mark.parametrize('row', ROWS, ids=lambda r: f'line{r["line"]}:{r["path"][16:]}')
def test_readme_command_runs_what_the_cited_run_ran(row):
  if not os.path.exists(os.path.join(REPO, row['path'])):
    if row['path'] in PENDING:
      pytest.skip(f'{row["path"]}: {PENDING[row["path"]]}')
    pytest.fail(f'README line {row["line"]} cites {row["path"]}, which does not exist')
  diffs = check_row(row)
  assert not diffs, (f'README line {row["line"]} does not run what {row["path"]} ran:\n  '
                     + '\n  '.join(diffs))


SEEDED_ROWS = [r for r in ROWS if '--seed' in r['args']]


@pytest.mark.parametrize('row', SEEDED_ROWS, ids=lambda r: f'line{r["line"]}:{r["path"][16:]}')
def test_a_line_naming_a_seed_cites_a_run_of_that_seed(row):
  """A line's `--seed N` is a seed the cited file ran (a comment's "seed 2" with another
  seed in the command would not be that run)."""
  seed = local.parse_args(row['args']).seed
  with open(os.path.join(REPO, row['path'])) as f:
    data = json.load(f)
  theirs = [run_local_args(r['command']) for r in data.get('runs', [data])]
  seeds = [local.parse_args(argv).seed for argv in theirs if task(argv) == task(row['args'])]
  assert seed in seeds, f'README line {row["line"]}: --seed {seed}; {row["path"]} ran {seeds}'


REPRODUCIBLE_ROWS = [r for r in ROWS if '--reproducible' in r['args']]


@pytest.mark.parametrize('row', REPRODUCIBLE_ROWS,
                         ids=lambda r: f'line{r["line"]}:{r["path"][16:]}')
def test_a_reproducible_line_names_its_seed_and_that_runs_exact_figure(row):
  """Issue 63: a `--reproducible` line names a seed, the cited file holds that seed's
  run made with `--reproducible`, exact to its end, and the line's comment gives that
  run's return at its budget as recorded (rounded: `seed N: exactly X`)."""
  args = local.parse_args(row['args'])
  assert '--seed' in row['args'], f'README line {row["line"]} names no --seed'
  with open(os.path.join(REPO, row['path'])) as f:
    data = json.load(f)
  runs = [r for r in data['runs'] if r['seed'] == args.seed]
  assert len(runs) == 1, f'{row["path"]} has {len(runs)} runs of seed {args.seed}'
  run = runs[0]
  assert '--reproducible' in run_local_args(run['command']), run['command']
  assert run.get('exact_until_round', 'absent') is None, run.get('not_exact_because')
  budget = args.max_env_steps
  mark = {1_000_000: 'return_at_1M', 300_000: 'return_at_300k'}[budget]
  with open(README) as f:
    line = f.read().splitlines()[row['line'] - 1]
  assert f'seed {args.seed}: exactly {round(run[mark]):,}' in line, (line, run[mark])


def _row(path: str) -> Dict[str, Any]:
  return next(r for r in ROWS if r['path'] == path)


def test_a_changed_registry_default_is_named(monkeypatch):
  """The R2D2 Pong run passed its batch of 8 as a flag; the registry's default is 8
  now. Change the default and the README line, which passes no flag, differs."""
  registry_config = registry.make_config

  def make_config(agent, env, num_train_envs=None, **overrides):
    if (agent, env) == ('r2d2', 'atari'):  # the registry's default, not a flag
      overrides = {'batch_size': 16, **overrides}
    return registry_config(agent, env, num_train_envs, **overrides)
  monkeypatch.setattr(registry, 'make_config', make_config)
  diffs = check_row(_row('bench/published/pong_learning_r2d2_b8.json'))
  assert diffs and all('agent_config_full.batch_size: README 16, published 8' in d
                       for d in diffs)


def test_a_recorded_config_is_what_is_compared(tmp_path):
  """A run that recorded its full config is compared with that record, not with its
  command resolved today: a recorded critic learning rate of 1e-4 is named against the
  README's; the training envs' options likewise."""
  row = _row('bench/published/mujoco_learning_sac.json')
  command = '.venv/bin/python -m seedacme.launchers.local ' + ' '.join(row['args'])
  record = {'name': 'HalfCheetah-v5_sac_s0', 'command': command, **resolve(row['args'])}
  record['agent_config_full']['critic_learning_rate'] = 1e-4
  record['env_config_full']['max_episode_steps'] = 500
  (tmp_path / 'run.json').write_text(json.dumps({'runs': [record]}))
  diffs = check_row({**row, 'path': str(tmp_path / 'run.json')})
  assert [d.split(': ', 1)[1].split(':')[0] for d in diffs] == [
      'agent_config_full.critic_learning_rate', 'env_config_full.max_episode_steps']


def test_registry_defaults_are_the_published_settings():
  """The settings the published PPO runs passed by hand or ran with are the defaults:
  MuJoCo's learning rate 4e-4 (issue 51's runs) decayed over 490 learner steps (~1M
  env steps), Atari's plain
  clip objective (the Pong run predates 'decoupled') and entropy cost 0.003 (the runs
  that reached +18 by 1.5M on seeds 0, 1 and 2); random first episodes on PPO's MuJoCo
  training envs only."""
  assert registry.make_config('ppo', 'mujoco').learning_rate_decay_steps == 490
  assert registry.make_config('ppo', 'mujoco').learning_rate == 4e-4
  assert registry.make_config('ppo', 'atari').objective == 'clip'
  assert registry.make_config('ppo', 'atari').entropy_cost == 0.003
  assert registry.train_env_config('ppo', 'mujoco') == {'random_first_episode': True}
  assert registry.train_env_config('ppo', 'atari') == {}
  assert registry.train_env_config('sac', 'mujoco') == {}
