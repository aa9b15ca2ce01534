"""bench/pong_learning.py's run means of the learner's metrics (policy lag, clip
fractions): each learner step counted once, though progress records repeat the latest
step's metrics until the next. Bazel ships the bench with the unit tests (BUILD,
`unit_test_support`); a tree without it skips."""

import pytest

from tests.unit.bench_modules import load

pong_learning = load('pong_learning')


def test_each_learner_step_counts_once_and_only_numbers_of_the_learner():
  records = [
      {'learner_steps': 0, 'learner_policy_lag': None, 'env_steps': 10},
      # step 1 reported by three records, step 2 by one, step 3 by two
      *[{'learner_steps': 1, 'learner_policy_lag': 1.0,
         'learner_proximal_clip_fraction': 0.1, 'learner_steps_per_s': 0.5,
         'average_return': -21.0}] * 3,
      {'learner_steps': 2, 'learner_policy_lag': 2.0, 'learner_proximal_clip_fraction': 0.4},
      *[{'learner_steps': 3, 'learner_policy_lag': 3.0,
         'learner_proximal_clip_fraction': float('nan')}] * 2,
  ]
  means = pong_learning.learner_means(records)
  assert means == pytest.approx({'policy_lag': 2.0, 'proximal_clip_fraction': 0.25})
