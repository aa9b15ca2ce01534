"""A stranger host floods the run's TLS endpoint while the run acts across hosts (issue
62, item 4: "a stranger host opens connections as fast as it can for 30 s; the run's own
cross-host acting keeps at least half its env steps/s and nothing times out").

The program is `bench/acting.py --cross_host`'s `tls` row (Catch, central inference over
Courier, `--acting_only`), started as `tests/integration/test_emulated_cluster.py` starts
its runs (its `Cluster`): replay and the central node on host A, both actors on host B,
each host's replicas behind its mutual-TLS endpoint. Host X is on the same bridge and not
in the run. Every process on the hosts starts at a soft limit of 1,024 descriptors, a
common default (the endpoint raises its own to the hard limit). After both actors serve:
env steps/s over `BASELINE_S`, then over `FLOOD_S` while X runs four flooders
(`tests/unit/tls_flooding.py`: connections held open, opened and closed, junk, TLS
without a certificate) at A's two ports, at the run's priority: on one machine they
take CPU from the run too (a real stranger host would spend its own), so the ratio
bounds what the endpoint loses and then some (flooding a sink on X itself instead of
A, the run kept 0.85 of its rate). A's endpoint soon shuns X (its SYNs dropped in the
kernel); `tests/unit/test_tls_flood.py` also floods an endpoint that never shuns.
"""

import json
import os
import resource
import shutil
import signal
import sys
import time

import pytest

from tests.emulated_hosts import EmulatedHosts
from tests.integration.launch import REPO, leftover_processes, tmpdir_without_underscore
from tests.integration.test_emulated_cluster import Cluster, _need_hosts_and_xmanager

pytestmark = pytest.mark.integration
BASELINE_S, FLOOD_S = 20.0, 30.0
MODES = ('hold', 'churn', 'junk', 'hello')


def _steps_per_s(cluster: Cluster, seconds: float):
  """Env steps/s over the next `seconds` (from the progress records at either end), and
  the records written meanwhile."""
  before = len(cluster.records())
  first = cluster.records()[-1]
  time.sleep(seconds)
  records = cluster.records()
  last = records[-1]
  span = last['elapsed_s'] - first['elapsed_s']
  assert span > 0.5 * seconds, (first, last)
  return (last['env_steps'] - first['env_steps']) / span, records[before:]


def _endpoint(log: str) -> dict:
  """The counters a launcher printed at exit (`TLS endpoint {...}`)."""
  return json.loads(log.split('TLS endpoint ')[1].split('\n')[0].replace("'", '"'))


@pytest.mark.long('cross-host acting, 20 s before and 30 s during a flood from a stranger '
                  'host: 2-4 min')
@pytest.mark.timeout(900)
def test_a_stranger_hosts_flood_leaves_the_runs_acting_half_its_rate_and_no_timeouts(
    tmp_path):
  _need_hosts_and_xmanager()
  work, tmp = str(tmp_path), tmpdir_without_underscore('seedacmeflood')
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # the hosts inherit it
  try:
    with EmulatedHosts(['a', 'b', 'x'], agent_log=os.path.join(work, 'agent.log')) as hosts:
      resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
      a, b, x = (hosts.addresses[h] for h in 'abx')
      spec = {'replay': [f'{a}:7000'], 'learner': [f'{a}:7001'],
              'actor': [f'{b}:7100', f'{b}:7101']}
      cluster = Cluster(hosts, work, tmp, spec, [
          'catch', 'vtrace', '2', '16', '--inference', 'central', '--transport', 'courier',
          '--acting_only', '--num_eval_envs', '0', '--max_seconds', '900',
          '--progress_interval_s', '1'])
      launchers = {'a': cluster.launch('a', 'replay/0,learner/0'),
                   'b': cluster.launch('b', 'actor/0,actor/1')}
      cluster.next_record(lambda r: r.get('actors_serving') == 2, 'both actors to serve',
                          400, after=0)
      time.sleep(5)  # past the first requests (the policy's first calls are slower)
      # What the actors logged while they waited for the central node to start is not
      # this test's: only what they log from here on.
      seen = {n: len(cluster.replica_log('b', n)) for n in ('actor/0', 'actor/1')}
      baseline, _ = _steps_per_s(cluster, BASELINE_S)
      flooders = [hosts.run('x', [
          sys.executable, '-m', 'tests.unit.tls_flooding', '--source', x, '--mode', mode,
          '--seconds', str(FLOOD_S),
          '--out', os.path.join(work, f'flood-{mode}.json'), f'{a}:7000', f'{a}:7001'],
          log=os.path.join(work, f'flood-{mode}.txt'), cwd=REPO) for mode in MODES]
      time.sleep(1)  # the flooders' start
      flooded, during = _steps_per_s(cluster, FLOOD_S - 2)
      for handle in flooders:
        assert hosts.wait(handle, 60) == 0
      # The actors' logs up to the flood's end: what the run's own shutdown makes them say
      # (a call cancelled as the central node stops) is not the flood's doing.
      actors = {n: cluster.replica_log('b', n)[seen[n]:] for n in seen}
      for host in 'ab':  # the run stops as a user's Ctrl-C would stop it
        hosts.signal(launchers[host], signal.SIGTERM)
        assert hosts.wait(launchers[host], 90) is not None, host
      with open(cluster.launcher_log('a')) as f:
        log_a = f.read()
  finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    leftovers = leftover_processes(cluster.tag) if 'cluster' in locals() else []
    shutil.rmtree(tmp, ignore_errors=True)
  flood = {}
  for mode in MODES:
    with open(os.path.join(work, f'flood-{mode}.json')) as f:
      flood[mode] = json.load(f)
  counters = _endpoint(log_a)
  tunnel_lines = [line for line in log_a.splitlines() if 'tls_tunnel' in line]
  print('env steps/s', round(baseline), '->', round(flooded), f'({flooded / baseline:.2f})',
        'flood', flood, 'endpoint', counters, 'tunnel log lines', len(tunnel_lines))
  # The stranger flooded, was refused by A's endpoint, and shunned: its SYNs dropped in
  # the kernel, each flooder's connect() then waits out its timeout.
  tried = sum(n for f in flood.values() for k, n in f.items() if k.startswith('conn'))
  assert tried >= 2 * FLOOD_S and counters['shunned'] >= 1, (flood, counters)
  assert counters['refused'] >= 40 and counters['accept_errors'] == 0, counters
  # The run's acting kept at least half its rate, both actors serving throughout, and
  # nothing of it timed out or failed.
  assert flooded >= 0.5 * baseline, (baseline, flooded)
  assert during and all(r.get('actors_serving') == 2 for r in during), during
  assert all(r.get('actor_restarts', 0) == 0 for r in during), during[-1]
  for name, log in actors.items():
    for sign in ('no answer from the inference server', 'inference call failed'):
      assert sign not in log, (name, sign, log[-3000:])
  # The endpoint said a few lines, not one per refusal or failed accept.
  assert len(tunnel_lines) <= 30 and 'Traceback' not in log_a, log_a[-5000:]
  assert not leftovers, leftovers
