"""Each agent page's results table is what the published JSONs give now (issue 50, item 2).

`docs/agents/<agent>.md` carries one results table between `<!-- results:begin -->` and
`<!-- results:end -->`, written by `bench/pages.py` from `bench/published/*.json`; no
figure in it is typed by hand. This regenerates every page in memory and fails, naming
the page and the command that rewrites it, when the page differs (a result republished,
a row changed in `bench/pages.py`'s `ROWS`, or a hand edit), and fails naming the file
when a row's JSON is missing. The pages' defaults tables are typed, so they are checked
for names only: every setting they name is still a field of the agent's config. Bazel
ships bench/pages.py, the pages and the JSONs with the unit tests (BUILD,
`unit_test_support`; the configs come with `:seedacme`).
"""

import dataclasses
import os

import pytest

from tests.unit.bench_modules import load

pages = load('pages')


@pytest.mark.parametrize('agent', sorted(pages.PAGES))
def test_page_is_current(agent):
  path = os.path.join(pages.REPO, pages.PAGES[agent])
  assert os.path.isfile(path), f'{pages.PAGES[agent]} is missing'
  with open(path) as f:
    text = f.read()
  try:
    expected = pages.regenerate(text, agent)
  except pages.MissingResult as e:
    pytest.fail(f'{pages.PAGES[agent]}: {e}')
  assert expected == text, (f'{pages.PAGES[agent]} is not current: run '
                            f'`{pages.COMMAND}` and commit the page')


def test_every_row_names_a_page_and_existing_files():
  for row in pages.ROWS:
    assert row.agent in pages.PAGES, f'{row} names no page'
    assert row.jsons, f'{row} names no JSON'
    for name in row.jsons:
      assert os.path.isfile(os.path.join(pages.REPO, pages.PUBLISHED, name)), (
          f'{pages.PUBLISHED}/{name} (the {row.agent} row for {row.task}) is missing')


def test_a_missing_json_fails_naming_it():
  row = dataclasses.replace(pages.ROWS[0], jsons=('no_such_result.json',))
  with pytest.raises(pages.MissingResult, match='no_such_result.json'):
    pages.figures(row)


def test_a_row_whose_runs_are_gone_fails():
  row = next(r for r in pages.ROWS if r.measure == 'final_return')
  gone = dataclasses.replace(row, select=(('task', 'NoSuchTask-v5'),))
  with pytest.raises(pages.MissingResult, match='NoSuchTask-v5'):
    pages.figures(gone)


def test_a_hand_edit_is_not_current(tmp_path):
  """A figure typed into the table is seen: the page no longer matches its JSONs."""
  agent = 'ppo'
  with open(os.path.join(pages.REPO, pages.PAGES[agent])) as f:
    text = f.read()
  table = pages.table(agent)
  edited = text.replace(table, table.replace('| **', '| **9', 1))
  assert edited != text
  assert pages.regenerate(edited, agent) == text


def test_median_and_range_over_seeds():
  assert pages._median_and_range([3.0, 1.0, 2.0], pages._number) == (
      '**2.00**', '1.00–3.00 (3 seeds)')
  assert pages._median_and_range([5089.0], pages._number) == ('**5,089**', 'one seed')
  assert pages._steps(1_000_000, exact=True) == '1M'
  assert pages._steps(1_500_000, exact=True) == '1.5M'
  assert pages._steps(300_000, exact=True) == '300k'
  assert pages._steps(1_289_056) == '1.29M'


def _config_fields(agent):
  """The fields of `agents/<agent>/config.py`'s dataclass, read without importing it."""
  import ast  # pylint: disable=g-import-not-at-top
  with open(os.path.join(pages.REPO, 'agents', agent, 'config.py')) as f:
    tree = ast.parse(f.read())
  return {node.target.id for cls in tree.body if isinstance(cls, ast.ClassDef)
          for node in cls.body if isinstance(node, ast.AnnAssign)}


@pytest.mark.parametrize('agent', sorted(pages.PAGES))
def test_defaults_name_fields_that_exist(agent):
  """Every setting the page's defaults table names in backticks (`field` or
  `field=value`) is a field of the agent's config, or a name in agents/registry.py
  (an env option, a fit): a renamed field shows here, not in a user's failed run."""
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(pages.REPO, pages.PAGES[agent])) as f:
    text = f.read()
  section = text[text.index('## Defaults and why'):text.index('## Results')]
  with open(os.path.join(pages.REPO, 'agents', 'registry.py')) as f:
    registry = f.read()
  fields = _config_fields(agent)
  names = {token.split('=')[0] for token in re.findall(r'`([^`\s]+)`', section)}
  unknown = sorted(name for name in names
                   if re.fullmatch(r'_?[a-z][a-z0-9]*(_[a-z0-9]+)+', name)
                   and name not in fields and name not in registry)
  assert not unknown, (f'{pages.PAGES[agent]} names settings that are neither '
                       f'{agent} config fields nor registry names: {unknown}')
