"""A seed names a run across hosts (issue 63): the reproducible V-trace Catch command of
`test_reproducible_program` run on one host (`run_local`, 2 x 8) and across two
emulated hosts (`launchers/cluster`, 4 x 4: the central node, replay and actor/0 on A;
actors 1-3 and the evaluator on B, through the run's mutual-TLS endpoint) gives the
same round records, the same evaluator passes and the same final weights.

The two programs run side by side, each the other's load (one test's time, not two).
The split differs between them, so the test also shows that a global env id, not the
actor or host holding it, decides what an env does. Neither records file holds a
timed field (`seedacme.run.monitor`: round records are written while acting and
learning both wait), so the records are compared whole.
"""

import json
import os
import shutil
import time

import pytest

from tests.emulated_hosts import EmulatedHosts
from tests.integration.launch import Run, leftover_processes, tmpdir_without_underscore
from tests.integration.test_emulated_cluster import ADDRESSES, Cluster, _need_hosts_and_xmanager
from tests.integration.test_reproducible_program import COMMAND, assert_same_exact_ends

pytestmark = pytest.mark.integration


def _lines(path: str) -> list:
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.long('two programs at once, one across two emulated hosts: 84 s at load 6-7')
@pytest.mark.timeout(420)
def test_reproducible_catch_is_the_same_run_on_one_host_and_across_two(tmp_path):
  _need_hosts_and_xmanager()
  a, b = ADDRESSES['a'], ADDRESSES['b']
  spec = {'replay': [f'{a}:7000'], 'learner': [f'{a}:7001'],
          'actor': [f'{a}:7100', f'{b}:7100', f'{b}:7101', f'{b}:7102'],
          'evaluator': [f'{b}:7103']}
  replicas = {'a': 'replay/0,learner/0,actor/0', 'b': 'actor/1,actor/2,actor/3,evaluator/0'}
  work, tmp = str(tmp_path / 'hosts'), tmpdir_without_underscore('seedacmerepro')
  os.makedirs(work)
  started = time.monotonic()
  try:
    with EmulatedHosts(['a', 'b'], agent_log=os.path.join(work, 'agent.log')) as hosts, \
        Run(COMMAND[:2] + ['2', '8'] + COMMAND[2:], str(tmp_path / 'one')) as one:
      cluster = Cluster(hosts, work, tmp, spec, COMMAND[:2] + ['4', '4'] + COMMAND[2:])
      for host, names in replicas.items():
        cluster.launch(host, names)
      one.complete(300)
      summary = cluster.wait_for('the run across hosts to end', cluster.summary, 300)
      codes = {h: hosts.wait(cluster.launches[h][0], 60) for h in replicas}
  finally:
    leftovers = leftover_processes(cluster.tag) if 'cluster' in locals() else []
    shutil.rmtree(tmp, ignore_errors=True)
  print(f'both programs ended in {time.monotonic() - started:.0f} s')
  assert codes == {'a': 0, 'b': 0}, codes
  assert not leftovers, leftovers
  # The cluster's actors reached the central node by both paths: A's through shared
  # memory, B's (and its evaluator) through Courier across the hosts' TLS endpoints.
  assert summary['transports'] == {'actor/0': 'shm', 'actor/1': 'courier',
                                   'actor/2': 'courier', 'actor/3': 'courier',
                                   'evaluator/0': 'courier'}, summary['transports']
  rounds = [_lines(os.path.join(d, 'rounds.jsonl')) for d in (one.logdir, cluster.logdir)]
  evals = [_lines(os.path.join(d, 'evals.jsonl')) for d in (one.logdir, cluster.logdir)]
  summaries = [one.json('summary.json'), summary]
  assert len(rounds[0]) == 21  # rounds 0..20: one learner step each
  assert [r['round'] for r in rounds[0]] == list(range(21))
  for i, (here, there) in enumerate(zip(*rounds)):
    assert here == there, f'round {i}: one host {here} != two hosts {there}'
  assert rounds[0] == rounds[1]
  assert evals[0] and evals[0] == evals[1]
  assert_same_exact_ends(summaries)
