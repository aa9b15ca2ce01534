"""bench/mujoco_learning.py's figures for a run resumed near its end.

A resumed run restores its episode count, but its training average starts over; one
resumed 100k env steps before its budget ends with an average over fewer than 100
HalfCheetah episodes (seed 1 of the SAC table: 96). The marks (return at 300k) keep to
full windows; the final average says how many episodes it covers, and the summary gives
the median of the final averages beside the marks. A new checkout has no run folders: a
finished seed is read back from the published JSON when its study ran the same
settings. The published JSON keeps its curves on one line each (`harness.dumps`). Bazel
ships bench/mujoco_learning.py and bench/harness.py with the unit tests (BUILD, `unit_test_support`); a tree without
them skips.
"""

import json

from tests.unit.bench_modules import load

mujoco_learning = load('mujoco_learning')


def _record(elapsed_s, env_steps, episodes, average_over, average_return):
  return {'elapsed_s': elapsed_s, 'env_steps': env_steps, 'episodes': episodes,
          'average_over': average_over, 'average_return': average_return,
          'learner_steps': env_steps}


def _resumed_run():
  """200 episodes in a first segment (full windows), then 96 after a resume at 200k."""
  records = [_record(1000.0 * i, 50_000 * i, 50 * i, min(100, 50 * i), 1000.0 * i)
             for i in range(1, 5)]
  records += [_record(100.0, 210_000, 208, 8, 4900.0),
              _record(800.0, 300_500, 296, 96, 5500.0)]
  summary = dict(records[-1], stopped_because='reached 300000 env steps',
                 stop={'kind': 'budget'})
  return records, summary


def _fresh_run(final):
  records = [_record(1000.0 * i, 100_000 * i, 100 * i, 100, final * i / 3)
             for i in range(1, 4)]
  records[-1]['env_steps'] = 300_400
  return records, dict(records[-1], stopped_because='reached', stop={'kind': 'budget'})


def test_a_run_resumed_near_its_end_reports_its_partial_final_window():
  figures, curve = mujoco_learning.analyse(*_resumed_run())
  assert figures['segments'] == 2 and figures['run_s'] == 4000.0 + 800.0
  assert figures['final_average_return'] == 5500.0 and figures['final_average_over'] == 96
  # Marks and the best keep to full windows: the resumed segment never filled one.
  assert figures['return_at_300k'] is None
  assert figures['best_average_return'] == 4000.0
  assert curve[-1] == [200_000, 4000.0]


def test_summary_medians_final_averages_beside_the_full_window_marks():
  rows = []
  for seed, (records, summary) in enumerate([_fresh_run(7000.0), _resumed_run(),
                                             _fresh_run(3000.0)]):
    figures, _ = mujoco_learning.analyse(records, summary)
    rows.append({'task': 'HalfCheetah-v5', 'agent': 'sac', 'seed': seed, **figures})
  [row] = mujoco_learning.summarize(rows)
  assert row['seeds'] == 3 and row['seeds_reaching_300k'] == 2
  assert row['median_return_at_300k'] == 5000.0  # median of 7,000 and 3,000 only
  assert row['median_final_average_return'] == 5500.0  # of 7,000, 5,500 and 3,000
  assert row['min_final_average_over'] == 96


def test_learner_means_count_each_learner_step_once_beside_the_record_mean():
  """`mean_policy_lag` (the published field) is a mean over progress records; the new
  `learner_means` counts each learner step once, as the Pong bench's does: step 1 (lag
  1) reported by three records and step 2 (lag 4) by one give 1.75 and 2.5."""
  records = [dict(_record(10.0 * i, 1000 * i, 0, 0, None), learner_steps=step,
                  learner_policy_lag=lag)
             for i, (step, lag) in enumerate([(1, 1.0), (1, 1.0), (1, 1.0), (2, 4.0)], 1)]
  figures, _ = mujoco_learning.analyse(records, dict(records[-1], stopped_because='x'))
  assert figures['mean_policy_lag'] == 1.75
  assert figures['learner_means'] == {'policy_lag': 2.5}


SETTINGS = {'env_steps': 300_000, 'actors': 2, 'envs_per_actor': 4, 'cap_s': 5400.0,
            'agent_config': [], 'passthrough': []}


def _publish(tmp_path, monkeypatch, runs):
  monkeypatch.setattr(mujoco_learning, 'PUBLISHED', str(tmp_path))
  curves = {'every_env_steps': 5_000, 'runs': [
      {'name': r['name'], 'env_steps': [5_000], 'average_return': [1.0],
       'eval_return': [None]} for r in runs]}
  (tmp_path / 'study.json').write_text(mujoco_learning.harness.dumps({
      'settings': SETTINGS, 'runs': runs, 'curves': {r['name']: [[5_000, 1.0]] for r in runs},
      'seed_curves': curves, 'load_1m': {r['name']: {'before': 1.0} for r in runs}}))


def test_a_finished_seed_is_read_back_from_the_published_json(tmp_path, monkeypatch):
  _publish(tmp_path, monkeypatch, [
      {'name': 'A_sac_s0', 'env_steps': 300_400, 'stop_kind': 'budget'},
      {'name': 'A_sac_s1', 'env_steps': 120_000, 'stop_kind': 'time'},
      {'name': 'A_sac_s2', 'env_steps': 90_000, 'stop_kind': 'diverged'}])
  kept = mujoco_learning.published_run('study', 'A_sac_s0', dict(SETTINGS, cap_s=9000.0),
                                       300_000)
  assert kept['row']['env_steps'] == 300_400 and kept['curve'] == [[5_000, 1.0]]
  assert kept['sampled']['average_return'] == [1.0] and kept['load_1m'] == {'before': 1.0}
  # Stopped before its budget: it needs its kept folder to resume; diverged: read back.
  assert mujoco_learning.published_run('study', 'A_sac_s1', SETTINGS, 300_000) is None
  assert mujoco_learning.published_run('study', 'A_sac_s2', SETTINGS, 300_000)
  # Other overrides, another study; no such file, nothing.
  other = dict(SETTINGS, agent_config=['epochs=4'])
  assert mujoco_learning.published_run('study', 'A_sac_s0', other, 300_000) is None
  assert mujoco_learning.published_run('nothing', 'A_sac_s0', SETTINGS, 300_000) is None


def test_published_json_is_compact_and_reads_back_the_same():
  value = {'machine': {'cores': 2, 'gpu': False}, 'curve': list(range(500)),
           'pairs': [[i, i / 3] for i in range(300)], 'rows': [
               {'name': f'run {i}', 'value': i * 1.5, 'seeds': [0, 1, 2]} for i in range(3)],
           'nested': {'deep': {'list': [{'a': 1}] * 40}}}
  text = mujoco_learning.harness.dumps(value)
  assert json.loads(text) == value
  assert len(text.splitlines()) < 60  # json.dump(indent=1) takes over 1,700


def test_a_study_that_would_lose_runs_is_not_published(tmp_path, monkeypatch):
  """Interrupted, a run missing, or fewer runs than the published file: refused, named."""
  monkeypatch.setattr(mujoco_learning, 'PUBLISHED', str(tmp_path))
  rows = [{'name': 'Hopper-v5_ppo_s0'}, {'name': 'Hopper-v5_ppo_s1'}]
  both = ['Hopper-v5_ppo_s0', 'Hopper-v5_ppo_s1']
  assert mujoco_learning.publish_refusal('study', rows, both, False) is None
  assert 'interrupted' in mujoco_learning.publish_refusal('study', rows, both, True)
  refusal = mujoco_learning.publish_refusal('study', rows[:1], both, False)
  assert refusal == 'runs with no result: Hopper-v5_ppo_s1'
  (tmp_path / 'study.json').write_text(json.dumps(
      {'runs': [{'name': n} for n in [*both, 'Ant-v5_ppo_s0']]}))
  refusal = mujoco_learning.publish_refusal('study', rows, both, False)
  assert 'Ant-v5_ppo_s0' in refusal and 'Hopper' not in refusal
  rows.append({'name': 'Ant-v5_ppo_s0'})
  assert mujoco_learning.publish_refusal(
      'study', rows, [*both, 'Ant-v5_ppo_s0'], False) is None
