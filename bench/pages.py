"""Writes each agent page's results table (`docs/agents/<agent>.md`) from the published JSONs.

`.venv/bin/python bench/pages.py` rewrites the part of every page between
`<!-- results:begin -->` and `<!-- results:end -->`; `--check` only says which pages are
not current (exit 1). No figure in that part is typed by hand: each row names the
published JSON(s) it reads (`ROWS`, the one list of which result feeds which row), and
the table shows the median and range over the seeds those files hold. What is typed here
is what no published JSON can hold: the reference figures (`Anchor`: CleanRL,
rl-baselines3-zoo, the IMPALA paper) with where each is recorded, and which result is the
current one for a task (the one docs/benchmarks.md, docs/atari.md or the README cite as
current; ablations and superseded runs stay out).

Shaped so because the pages are read by users and checked by a test
(`tests/unit/test_agent_pages.py` regenerates them in memory): a row whose JSON is
missing raises `MissingResult` naming the file and the row, rather than printing a stale
or empty cell. Reads only keys the published JSONs already carry (`runs`, `settings`,
`milestones`, `rows`, `final_average_return`, ...), never the CSVs or kept runs, and
imports nothing but the standard library (no TensorFlow).
"""

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
from typing import Any, Dict, List, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join('bench', 'published')
COMMAND = '.venv/bin/python bench/pages.py'
BEGIN = '<!-- results:begin -->'
END = '<!-- results:end -->'
PAGES = {agent: os.path.join('docs', 'agents', f'{agent}.md')
         for agent in ('vtrace', 'r2d2', 'ppo', 'sac')}
# How a page links into bench/published (pages live in docs/agents/).
LINK_PREFIX = '../../bench/published/'


class MissingResult(FileNotFoundError):
  """A row's published JSON (or the run in it) is not there."""


@dataclasses.dataclass(frozen=True)
class Anchor:
  """A reference figure for a task, as its authors report it.

  Attributes:
    who: whose result ('CleanRL', 'rl-baselines3-zoo', ...).
    figure: the figure as reported (with its spread or budget where that differs).
    source: where this project records it (a doc, an issue), so it can be checked.
  """
  who: str
  figure: str
  source: str


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of an agent's table: a task, what is measured, the files it is read from.

  Attributes:
    agent: whose page the row is on.
    task: the task as the page names it.
    measure: 'final_return' (bench/mujoco_learning.py JSONs: each seed's training
      average over its last 100 episodes at the budget), 'steps_to' (bench/pong_learning.py
      JSONs, one per seed: env steps until the training average first crosses
      `milestone`), 'return_at_end' (one run's training average when it stopped) or
      'solve_steps' (bench/time_to_solve.py JSONs: env steps to the target).
    jsons: files under bench/published (one per seed for 'steps_to').
    select: which runs of a multi-run JSON belong to the row (keys of its `runs` or
      `rows` entries, e.g. {'task': 'Hopper-v5'}).
    milestone: for 'steps_to', a key of the JSON's `milestones` ('+18', '+0', ...).
    pictures: the curves' PNGs under bench/published, if not `<json stem>.png`.
    anchors: reference figures for this task and budget.
    note: what the reader must know to read the row (no figures).
  """
  agent: str
  task: str
  measure: str
  jsons: Tuple[str, ...]
  select: Tuple[Tuple[str, Any], ...] = ()
  milestone: str = ''
  pictures: Tuple[str, ...] = ()
  anchors: Tuple[Anchor, ...] = ()
  note: str = ''


_ISSUE36 = 'issue 36 (CleanRL\'s `ppo_continuous_action` table, v4, 1M steps)'
_ZOO = 'rl-baselines3-zoo\'s `benchmark.md` (tuned `ppo`, 1M steps)'
_HOPPER_ANCHORS = (Anchor('CleanRL', '2,383 ± 272', _ISSUE36),
                   Anchor('rl-baselines3-zoo', '2,410', _ZOO))
_HALFCHEETAH_ANCHORS = (Anchor('CleanRL', '1,443 ± 46', _ISSUE36),
                        Anchor('rl-baselines3-zoo', '5,819', _ZOO))
_WALKER2D_ANCHORS = (Anchor('CleanRL', '2,288 ± 572', 'issue 51'),
                     Anchor('rl-baselines3-zoo', '3,479', 'issue 51'))
_XEON = 'ran on an Intel Xeon, 2 cores, one run at a time'
_EXACT = ('each seed exact: the same command and seed give its figure on an x86-64 CPU '
          'with AVX2')
_REPEATED = ' (seed 0 run again: the same records and weights)'

# Which published result feeds which row: the current one for each agent and task.
ROWS: Tuple[Row, ...] = (
    # V-trace. MuJoCo: the rows at today's defaults (docs/history.md, "V-trace MuJoCo
    # rows at today's defaults"; Hopper's three seeds, "Three seeds of Hopper then").
    Row('vtrace', 'HalfCheetah-v5', 'final_return', ('mujoco_vtrace_issue36_check.json',),
        select=(('task', 'HalfCheetah-v5'),),
        note='registry defaults, untuned for MuJoCo'),
    Row('vtrace', 'Hopper-v5', 'final_return', ('mujoco_learning_vtrace_hopper_check.json',),
        select=(('task', 'Hopper-v5'),), note='registry defaults, untuned for MuJoCo'),
    Row('vtrace', 'Pong (Atari)', 'steps_to', ('pong_learning.json',), milestone='+18',
        pictures=('pong_curve.png',),
        anchors=(Anchor('IMPALA (paper)', '+18 by about 5M env steps',
                        'docs/history.md, "Pong learns"'),),
        note='resumed three times on its logdir (the JSON\'s command)'),
    Row('vtrace', 'Football academy_empty_goal_close', 'return_at_end',
        ('football_learning.json',),
        pictures=('football_academy_empty_goal_close_curve.png',),
        note='simple115v2 observations and an MLP: the JSON\'s command sets them'),
    Row('vtrace', 'CartPole', 'solve_steps', ('time_to_solve_issue36_check.json',),
        select=(('env', 'cartpole'), ('agent', 'vtrace'), ('agent_config', 'defaults'))),
    Row('vtrace', 'Catch', 'solve_steps', ('time_to_solve_issue36_check.json',),
        select=(('env', 'catch'), ('agent', 'vtrace'), ('agent_config', 'defaults'))),
    # R2D2 (docs/history.md, "R2D2 on Pong"; docs/history.md, "R2D2 CartPole over seeds").
    Row('r2d2', 'Pong (Atari)', 'steps_to', ('pong_learning_r2d2_b8.json',), milestone='+0',
        pictures=('pong_r2d2_b8_curve.png',)),
    Row('r2d2', 'Pong (Atari)', 'return_at_end', ('pong_learning_r2d2_b8.json',),
        pictures=('pong_r2d2_b8_curve.png',),
        note='the training average includes exploration (Ape-X epsilons up to 0.4)'),
    Row('r2d2', 'CartPole', 'solve_steps', ('r2d2_cartpole_study.json',),
        select=(('env', 'cartpole'), ('agent', 'r2d2'), ('agent_config', 'defaults'))),
    # PPO (README; docs/history.md, "PPO for an asynchronous system"; docs/history.md,
    # "Entropy cost 0.003"; MuJoCo: "A learning rate of 4e-4 on all four tasks", one
    # Intel Xeon).
    Row('ppo', 'HalfCheetah-v5', 'final_return', ('mujoco_ppo_halfcheetah_lr4e4.json',),
        select=(('task', 'HalfCheetah-v5'),), anchors=_HALFCHEETAH_ANCHORS,
        note='its own registry entry, initial std 0.5 and 4 epochs: with the shared std 1 '
             'the early noise turns it over and it learns to run on its back (~1,700); '
             + _XEON),
    Row('ppo', 'HalfCheetah-v5, `--reproducible`', 'final_return',
        ('mujoco_ppo_halfcheetah_reproducible.json',), select=(('task', 'HalfCheetah-v5'),),
        anchors=_HALFCHEETAH_ANCHORS,
        note='its own registry entry as above; ' + _EXACT + _REPEATED + '; ' + _XEON),
    Row('ppo', 'Hopper-v5', 'final_return', ('mujoco_ppo_hopper_lr4e4.json',),
        select=(('task', 'Hopper-v5'),), anchors=_HOPPER_ANCHORS, note=_XEON),
    Row('ppo', 'Hopper-v5, `--reproducible`', 'final_return',
        ('mujoco_ppo_hopper_reproducible.json',), select=(('task', 'Hopper-v5'),),
        anchors=_HOPPER_ANCHORS,
        note=_EXACT + _REPEATED + '; ' + _XEON),
    Row('ppo', 'Walker2d-v5', 'final_return', ('mujoco_ppo_walker2d_lr4e4.json',),
        select=(('task', 'Walker2d-v5'),),
        anchors=_WALKER2D_ANCHORS, note=_XEON),
    Row('ppo', 'Walker2d-v5, `--reproducible`', 'final_return',
        ('mujoco_ppo_walker2d_reproducible.json',), select=(('task', 'Walker2d-v5'),),
        anchors=_WALKER2D_ANCHORS, note=_EXACT + _REPEATED + '; ' + _XEON),
    Row('ppo', 'Ant-v5', 'final_return', ('mujoco_ppo_ant_lr4e4.json',),
        select=(('task', 'Ant-v5'),),
        anchors=(Anchor('rl-baselines3-zoo', '1,327', 'issue 51'),),
        note='without the contact forces in the observation (the default; with them, '
             'seed 0 reached 415); ' + _XEON),
    Row('ppo', 'Ant-v5, `--reproducible`', 'final_return',
        ('mujoco_ppo_ant_reproducible.json',), select=(('task', 'Ant-v5'),),
        anchors=(Anchor('rl-baselines3-zoo', '1,327', 'issue 51'),),
        note='without the contact forces, as above; ' + _EXACT + '; ' + _XEON),
    Row('ppo', 'Pong (Atari)', 'steps_to',
        ('pong_learning_ppo_e3_s0.json', 'pong_learning_ppo_e3_s1.json',
         'pong_learning_ppo_e3_s2.json'), milestone='+18',
        pictures=('pong_ppo_e3_s0_curve.png', 'pong_ppo_e3_s1_curve.png',
                  'pong_ppo_e3_s2_curve.png'),
        note='entropy cost 0.003, a queue of one unroll: the registry\'s Atari defaults'),
    Row('ppo', 'CartPole', 'solve_steps', ('time_to_solve_issue36_check.json',),
        select=(('env', 'cartpole'), ('agent', 'ppo'), ('agent_config', 'defaults'))),
    Row('ppo', 'Catch', 'solve_steps', ('time_to_solve_issue36_check.json',),
        select=(('env', 'catch'), ('agent', 'ppo'), ('agent_config', 'defaults'))),
    # SAC (docs/history.md, "SAC HalfCheetah-v5 (issue 25)").
    Row('sac', 'HalfCheetah-v5', 'final_return', ('mujoco_learning_sac.json',),
        select=(('task', 'HalfCheetah-v5'),),
        anchors=(Anchor('CleanRL', '~5,000–6,000 at 300k (~9,600 at 1M)',
                        'docs/history.md ("SAC HalfCheetah-v5 (issue 25)"); issue 25'),),
        note='2 actors x 4 envs; seed 1 was resumed with an empty replay'),
    Row('sac', 'Ant-v5', 'final_return', ('mujoco_sac_ant.json',),
        select=(('task', 'Ant-v5'),),
        anchors=(Anchor('rl-baselines3-zoo', '4,616 at 1M', 'issue 51'),),
        note='2 actors x 4 envs, one seed; the registry\'s SAC MuJoCo defaults'),
)

# Reference figures for tasks with no published run here yet: (agent, task, budget).
NOT_RUN: Tuple[Tuple[str, str, str, Tuple[Anchor, ...]], ...] = ()


# --- reading the JSONs -----------------------------------------------------------------

def _load(name: str, row: Row, root: str) -> Dict[str, Any]:
  path = os.path.join(root, PUBLISHED, name)
  if not os.path.isfile(path):
    raise MissingResult(f'{PUBLISHED}/{name} (the {row.agent} row for {row.task}) is '
                        'missing: publish it again or change ROWS in bench/pages.py')
  with open(path) as f:
    return json.load(f)


def _selected(entries: Sequence[Dict[str, Any]], row: Row, name: str) -> List[Dict[str, Any]]:
  chosen = [e for e in entries if all(e.get(k) == v for k, v in row.select)]
  if not chosen:
    raise MissingResult(f'{PUBLISHED}/{name} holds no run with {dict(row.select)} (the '
                        f'{row.agent} row for {row.task})')
  return chosen


# bench/time_to_solve.py's targets, for its JSONs that do not record them (the R2D2 study).
_SOLVE_TARGETS = {'catch': 0.9, 'cartpole': 475.0}


def _max_env_steps(command: str) -> int | None:
  """The last `--max_env_steps N` of a command (resumes append theirs)."""
  found = re.findall(r'--max_env_steps[ =](\d+)', command)
  return int(found[-1]) if found else None


@dataclasses.dataclass
class Figures:
  """What one row shows, read from its JSONs."""
  values: List[float]
  budget: str
  measure: str
  greedy: List[float]
  files: List[str]


def figures(row: Row, root: str = REPO) -> Figures:
  """Reads `row`'s JSONs; raises `MissingResult` when a file or its run is not there."""
  docs = [(name, _load(name, row, root)) for name in row.jsons]
  if row.measure == 'final_return':
    (name, doc), = docs
    runs = _selected(doc['runs'], row, name)
    budget = doc['settings']['env_steps']
    windows = [r.get('final_average_over', 100) for r in runs]
    short = (f' (one seed\'s over its last {min(windows)} episodes: resumed)'
             if min(windows) < 100 else '')
    return Figures([r['final_average_return'] for r in runs], _steps(budget, exact=True),
                   'training average at the budget' + short,
                   [r['eval_return_at_end'] for r in runs
                    if r.get('eval_return_at_end') is not None], list(row.jsons))
  if row.measure == 'steps_to':
    values = []
    for name, doc in docs:
      crossed = doc['milestones'].get(row.milestone)
      if crossed is None:
        raise MissingResult(f'{PUBLISHED}/{name} never reached {row.milestone} (the '
                            f'{row.agent} row for {row.task})')
      values.append(crossed['env_steps'])
    budgets = {_max_env_steps(doc['command']) for _, doc in docs}
    budget = budgets.pop() if len(budgets) == 1 else None
    return Figures(values, _steps(budget, exact=True) if budget else '–',
                   f'env steps to a training average of {"0" if row.milestone == "+0" else row.milestone}',
                   [],
                   list(row.jsons))
  if row.measure == 'return_at_end':
    (name, doc), = docs
    why = doc['stopped_because']
    budget = f'{_steps(doc["env_steps"])} (stopped by {why.replace("reached ", "")})'
    greedy = doc.get('final_eval_average_return')
    return Figures([doc['final_average_return']], budget,
                   'training average at the end',
                   [] if greedy is None else [greedy], list(row.jsons))
  if row.measure == 'solve_steps':
    (name, doc), = docs
    runs = _selected(doc['rows'], row, name)
    unsolved = [r for r in runs if not r.get('solved')]
    if unsolved:
      raise MissingResult(f'{PUBLISHED}/{name}: {len(unsolved)} run(s) of the {row.agent} '
                          f'row for {row.task} did not reach the target')
    env = dict(row.select)['env']
    on = {r['target_on'] for r in runs}
    where = 'greedy evaluator' if on == {'eval'} else 'training average'
    target = doc.get('targets', _SOLVE_TARGETS)[env]
    return Figures([r['env_steps'] for r in runs], 'to the target',
                   f'env steps to a {where} of {target:g}', [], list(row.jsons))
  raise ValueError(f'unknown measure {row.measure!r} in the {row.agent} row for {row.task}')


# --- formatting ------------------------------------------------------------------------

def _steps(n: float | None, exact: bool = False) -> str:
  """Env steps as 1M, 300k, 4.52M, 54.6k (`exact`: whole millions/thousands plain)."""
  if n is None:
    return '–'
  if exact and n % 100_000 == 0 and n >= 1_000_000:
    return f'{n / 1e6:g}M'
  if exact and n % 1_000 == 0 and n < 1_000_000:
    return f'{n // 1_000:,.0f}k'
  if n >= 1_000_000:
    return f'{n / 1e6:.2f}M'
  if n >= 1_000:
    return f'{n / 1e3:.1f}k'
  return f'{n:,.0f}'


def _number(x: float) -> str:
  """A return: 5,089; 18.1; 0.84."""
  if abs(x) >= 100:
    return f'{x:,.0f}'
  if abs(x) >= 10:
    return f'{x:.1f}'
  return f'{x:.2f}'


def _median_and_range(values: List[float], fmt) -> Tuple[str, str]:
  median = fmt(statistics.median(values))
  if len(values) == 1:
    return f'**{median}**', 'one seed'
  return f'**{median}**', f'{fmt(min(values))}–{fmt(max(values))} ({len(values)} seeds)'


def _pictures(row: Row, root: str) -> List[str]:
  """The row's curves: `<json stem>.png` where it exists, else the named PNGs."""
  found = []
  for name in row.jsons:
    stem = os.path.splitext(name)[0] + '.png'
    if os.path.isfile(os.path.join(root, PUBLISHED, stem)):
      found.append(stem)
  if not found:
    found = [p for p in row.pictures if os.path.isfile(os.path.join(root, PUBLISHED, p))]
  return found


def _link(name: str, text: str | None = None) -> str:
  return f'[{text or name}]({LINK_PREFIX}{name})'


def _anchors(anchors: Sequence[Anchor]) -> str:
  return '; '.join(f'{a.who} {a.figure}' for a in anchors) or '–'


def table(agent: str, root: str = REPO) -> str:
  """The generated part of `agent`'s page (between the markers, exclusive)."""
  rows = [r for r in ROWS if r.agent == agent]
  lines = [f'<!-- generated by `{COMMAND}` from bench/published: change ROWS there and '
           'rerun it, do not edit this part -->', '',
           '| task | budget (env steps) | measured | median | range over seeds | '
           'greedy at end (median) | anchors | data | curves |',
           '|---|---|---|---|---|---|---|---|---|']
  sources, notes, shown = [], [], []
  for row in rows:
    got = figures(row, root)
    fmt = _steps if row.measure in ('steps_to', 'solve_steps') else _number
    median, spread = _median_and_range(got.values, fmt)
    greedy = _number(statistics.median(got.greedy)) if got.greedy else '–'
    data = ', '.join(_link(f, os.path.splitext(f)[0]) for f in got.files)
    pictures = _pictures(row, root)
    curves = ', '.join(_link(p, 'png') for p in pictures) or '–'
    shown += [(row.task, p) for p in pictures if p not in [q for _, q in shown]]
    task = row.task
    if row.note:
      if row.note not in notes:
        notes.append(row.note)
      task += f' ({notes.index(row.note) + 1})'
    lines.append(f'| {task} | {got.budget} | {got.measure} | {median} | {spread} | '
                 f'{greedy} | {_anchors(row.anchors)} | {data} | {curves} |')
    sources += [a for a in row.anchors if a not in sources]
  lines += ['', 'Training average: over the last 100 training episodes (sampled actions); '
            'greedy: the evaluator\'s last 20 episodes (the policy\'s mode); a median and '
            'range are over the seeds of the data column.']
  lines += [''] + [f'({n}) {note}.' for n, note in enumerate(notes, 1)] if notes else []
  not_run = [(task, budget, anchors) for who, task, budget, anchors in NOT_RUN
             if who == agent]
  if not_run:
    lines += ['', 'Not run here yet, with the reference figures a run would stand beside: ' +
              '; '.join(f'{task} at {budget} ({_anchors(anchors)})'
                        for task, budget, anchors in not_run) + '.']
    sources += [a for _, _, anchors in not_run for a in anchors if a not in sources]
  if shown:
    lines += ['', 'The curves published beside those JSONs (returns against env steps):', '']
    lines += [f'![{task}: {os.path.splitext(p)[0]}]({LINK_PREFIX}{p})' for task, p in shown]
  if sources:
    by_source: Dict[str, List[str]] = {}
    for a in sources:
      by_source.setdefault(a.source, []).append(f'{a.who} {a.figure}')
    lines += ['', 'Where each reference figure is recorded: ' + '; '.join(
        f'{", ".join(figs)}: {source}' for source, figs in by_source.items()) + '.']
  return '\n'.join(lines)


def regenerate(text: str, agent: str, root: str = REPO) -> str:
  """`text` (a page) with its results part replaced by `table(agent)`."""
  start, end = text.find(BEGIN), text.find(END)
  if start < 0 or end < start:
    raise ValueError(f'{PAGES[agent]} has no {BEGIN} ... {END} section')
  return text[:start + len(BEGIN)] + '\n' + table(agent, root) + '\n' + text[end:]


def stale_pages(root: str = REPO) -> List[str]:
  """Pages whose results part differs from what the JSONs give now."""
  stale = []
  for agent, page in PAGES.items():
    with open(os.path.join(root, page)) as f:
      text = f.read()
    if regenerate(text, agent, root) != text:
      stale.append(page)
  return stale


def main(argv: List[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='only report pages that are not current (exit 1 if any)')
  args = parser.parse_args(argv)
  if args.check:
    stale = stale_pages()
    for page in stale:
      print(f'{page} is not current: run {COMMAND}')
    return 1 if stale else 0
  for agent, page in PAGES.items():
    path = os.path.join(REPO, page)
    with open(path) as f:
      text = f.read()
    new = regenerate(text, agent)
    if new != text:
      with open(path, 'w') as f:
        f.write(new)
      print(f'{page}: results rewritten')
    else:
      print(f'{page}: current')
  return 0


if __name__ == '__main__':
  sys.exit(main())
