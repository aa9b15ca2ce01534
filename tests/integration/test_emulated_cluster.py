"""The cluster launcher across emulated hosts (issue 37): every host its own network
namespace and address (`tests/emulated_hosts.py`), the same `launchers/cluster` command
on each with its `--replicas`, one shared logdir (the namespaces share the filesystem).

Faults are the network's and the hosts': a link down (partition), a host's processes
killed for good (lost host) or the central host's (preemption), then the launcher run
again there. One V-trace program carries every scenario but the replay host's (R2D2,
the second program), since a program's start is most of a test's time: at load ~10 on
2 cores the central node's imports and compile took ~2 minutes of the Catch test's
424 s (R2D2: 204 s). Traffic goes only to the hosts' own 10.77.0.x addresses, inside
the test's own user and network namespaces (no route out).
"""

import json
import os
import shutil
import sys
import time
import uuid
from typing import Callable, Dict, List

import pytest

from seedacme.run import logdir as logdir_lib
from tests.emulated_hosts import EmulatedHosts, skip_reason
from tests.integration.launch import (TAG_VAR, WITHOUT_NAMESPACES, checkpointed_learner_step,
                                     leftover_processes,
                                      tmpdir_without_underscore)

pytestmark = pytest.mark.integration
_WHY = skip_reason()


def _need_hosts_and_xmanager() -> None:
  if _WHY is not None:
    pytest.skip(f'emulated hosts: {_WHY}')
  if os.environ.get('SEEDACME_REQUIRE_VERTEX') == '1':
    import xmanager  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  else:
    pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')


class Cluster:
  """Launchers of one program on emulated hosts, its logdir and what it logged."""

  def __init__(self, hosts: EmulatedHosts, work: str, tmp: str,
               spec: Dict[str, List[str]], flags: List[str]):
    """`work`: logdir, logs; `tmp`: the launchers' temp dirs (a path without '_':
    Launchpad 0.5.0's Vertex executables cannot use one)."""
    self.hosts, self.work, self.tmp = hosts, work, tmp
    self.tag = uuid.uuid4().hex
    self.logdir = os.path.join(work, 'logdir')
    spec_file = os.path.join(work, 'cluster.json')
    with open(spec_file, 'w') as f:
      json.dump(spec, f)
    self.flags = [*flags, '--logdir', self.logdir, '--cluster_spec', f'@{spec_file}']
    self.launches: Dict[str, List[int]] = {}  # host -> its launchers' handles

  def launch(self, host: str, replicas: str, prefix: List[str] = ()) -> int:
    """The README's command on `host`, starting `replicas` (under `prefix`, e.g.
    `WITHOUT_NAMESPACES`: that host then cannot make a namespace)."""
    n = len(self.launches.setdefault(host, []))
    tmp = os.path.join(self.tmp, f'{host}{n}')
    os.makedirs(tmp)
    handle = self.hosts.run(
        host, [*prefix, sys.executable, '-m', 'seedacme.launchers.cluster', *self.flags,
               '--replicas', replicas,
               '--replica_logs', os.path.join(self.work, f'replicas{host}')],
        env={'TMPDIR': tmp, 'HOME': self.work, TAG_VAR: self.tag},
        log=self.launcher_log(host, n), cwd=self.work)
    self.launches[host].append(handle)
    return handle

  def launcher_log(self, host: str, n: int = 0) -> str:
    return os.path.join(self.work, f'launcher{host}{n}.txt')

  def replica_log(self, host: str, replica: str) -> str:
    with open(os.path.join(self.work, f'replicas{host}', replica.replace('/', '-')),
              errors='replace') as f:
      return f.read()

  def log_with(self, host: str, replica: str, text: str, timeout: float) -> str:
    """`replica`'s log once it holds `text`."""
    def has():
      log = self.replica_log(host, replica)
      return log if text in log else None
    return self.wait_for(f'{replica} to log {text!r}', has, timeout)

  def records(self) -> List[Dict]:
    try:
      return [r for r in logdir_lib.read_progress(self.logdir) if 'event' not in r]
    except (OSError, ValueError):
      return []

  def events(self) -> List[str]:
    try:
      return logdir_lib.read_events(self.logdir)
    except (OSError, ValueError):
      return []

  def summary(self) -> Dict | None:
    return logdir_lib.read_summary(self.logdir)

  def wait_for(self, what: str, predicate: Callable[[], object], timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      got = predicate()
      if got:
        return got
      time.sleep(0.5)
    raise AssertionError(f'timed out after {timeout:.0f}s waiting for {what}; last '
                         f'record: {(self.records() or [None])[-1]}')

  def next_record(self, predicate: Callable[[Dict], bool], what: str, timeout: float,
                  after: int | None = None) -> Dict:
    """The first record after the `after`-th (default: those written so far) that
    satisfies `predicate`."""
    start = len(self.records()) if after is None else after
    return self.wait_for(what, lambda: next(
        (r for r in self.records()[start:] if predicate(r)), None), timeout)


ADDRESSES = {'a': '10.77.0.2', 'b': '10.77.0.3', 'c': '10.77.0.4', 'x': '10.77.0.5'}  # EmulatedHosts(['a', 'b', 'c', 'x'])

# Host X is on the run's bridge but not in the run: it calls every port of every run
# host as Courier (a `step` whose argument rebuilds as `os.mkdir(marker)`) and as TLS
# with a certificate of its own CA. Each outcome is written as JSON.
_INTRUDER = """
import json, os, socket, ssl, sys, tempfile
from courier.python import client as courier_client
from seedacme.wire import tls_tunnel as tt
addresses, marker, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]

class Payload:
  def __reduce__(self):
    return (os.mkdir, (marker,))

own = tempfile.mkdtemp()
tt.make_ca(own, 'intruder')
cert = tt.issue_leaf(own, '10.77.0.5', own, 'intruder')
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
ctx.load_cert_chain(*cert)
outcomes = {}
for address in addresses:
  host, port = address.rsplit(':', 1)
  try:
    courier_client.Client(address, call_timeout=5).step(Payload())
    courier = 'answered'
  except Exception as e:  # pylint: disable=broad-except
    courier = type(e).__name__
  try:
    s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5))
    s.sendall(b'PRI * HTTP/2.0')
    data = s.recv(100)  # TLS 1.3: the server checks the client's certificate after
    tls = 'answered: ' + repr(data) if data else 'closed'  # the client's handshake ends
  except (ssl.SSLError, OSError) as e:
    tls = type(e).__name__
  outcomes[address] = {'courier': courier, 'tls': tls}
with open(out, 'w') as f:
  json.dump(outcomes, f)
"""


def _intrude(hosts, spec: Dict[str, List[str]], work: str) -> Dict:
  """Runs the intruder on X against every address of the spec; its outcomes."""
  script, out = os.path.join(work, 'intruder.py'), os.path.join(work, 'intruder.json')
  with open(script, 'w') as f:
    f.write(_INTRUDER)
  addresses = sorted({a for pool in spec.values() for a in pool})
  handle = hosts.run('x', [sys.executable, script, json.dumps(addresses),
                           os.path.join(work, 'intruder-ran'), out],
                     log=os.path.join(work, 'intruder.txt'), cwd=work)
  assert hosts.wait(handle, 120) == 0, open(os.path.join(work, 'intruder.txt')).read()[-3000:]
  with open(out) as f:
    return json.load(f)


def _listening(hosts, host: str, work: str) -> List[str]:
  """The TCP addresses listening in `host`'s own network namespace (`ss`)."""
  log = os.path.join(work, f'ss-{host}.txt')
  assert hosts.wait(hosts.run(host, ['ss', '-Hltn'], log=log), 20) == 0
  with open(log) as f:
    return sorted(line.split()[3] for line in f if line.strip())


@pytest.mark.long('learns Catch to 0.9 across emulated hosts through partitions, lost hosts and an intruder: 3-5 min')
@pytest.mark.timeout(900)
def test_catch_across_hosts_survives_partitions_lost_hosts_and_a_preempted_center(tmp_path):
  """V-trace Catch, the same command on each host: central node, replay and actor/0 on
  A, actor/1 on B, actor/2 and the evaluator on C. (a) Every actor serves, by the
  right transport. (c) C lost for good. (b) B's link down for 20 s; then again, longer
  than TCP's retransmission limit. (d) A's processes killed (a preemption) and its
  launcher run again. (c) C's launcher run again, now with the evaluator: it rejoins,
  and the run reaches its target. The target is the evaluator's, and the evaluator
  starts only with C's second launcher, so the run cannot end before every fault was
  shown (with the evaluator on C from the start, CI's run reached 1.0 over 20 greedy
  episodes at 34 s, before C was lost; with it on B, while C was away). (f) Host X, on the same bridge but not in the run, calls
  every port of every run host while the run trains: refused at the handshake, its
  payload never runs, and each run host listens on nothing but its TLS endpoint."""
  _need_hosts_and_xmanager()
  a, b, c = ADDRESSES['a'], ADDRESSES['b'], ADDRESSES['c']
  spec = {'replay': [f'{a}:7000'], 'learner': [f'{a}:7001'],
          'actor': [f'{a}:7100', f'{b}:7100', f'{c}:7100'], 'evaluator': [f'{c}:7101']}
  replicas = {'a': 'replay/0,learner/0,actor/0', 'b': 'actor/1', 'c': 'actor/2'}
  rejoin_c = 'actor/2,evaluator/0'  # C's second launcher brings the evaluator
  work, tmp = str(tmp_path), tmpdir_without_underscore('seedacmecluster')
  timings = {}
  started = time.monotonic()
  try:
    with EmulatedHosts(['a', 'b', 'c', 'x'], agent_log=os.path.join(work, 'agent.log')) as hosts:
      cluster = Cluster(hosts, work, tmp, spec, [
          'catch', 'vtrace', '3', '8', '--max_seconds', '600', '--target_return', '0.9',
          '--target_on', 'eval', '--progress_interval_s', '3',
          '--checkpoint_interval_s', '10'])
      for host, names in replicas.items():
        cluster.launch(host, names)

      # (a) Every actor serves: A's through shared memory, B's and C's through
      # Courier. The offer reaches them too (one boot id on every emulated host), but
      # its abstract socket lives in A's network namespace: they fall back, and say so.
      serving = cluster.next_record(lambda r: r.get('actors_serving') == 3,
                                    'every actor to serve', 300, after=0)
      timings['serving'] = time.monotonic() - started
      assert serving['actors_courier'] == 2 and serving['actors_shm'] == 1, serving
      assert not serving.get('evaluator_serving'), serving
      assert 'requests through shared memory' in cluster.replica_log('a', 'actor/0')
      for host, replica in (('b', 'actor/1'), ('c', 'actor/2')):
        log = cluster.log_with(host, replica, '(courier)', 10)  # its first answer
        assert 'shared memory offered but not attached' in log, log[-2000:]
        assert 'requests through shared memory' not in log

      # (f) An intruder on the bridge: every port of every run host refuses it at the
      # handshake; nothing it sent was parsed (its payload would have made `marker`).
      # Each host listens only on its spec address, at its replicas' ports.
      for host, ports in (('a', (7000, 7001, 7100)), ('b', (7100,)), ('c', (7100,))):
        assert _listening(hosts, host, work) == sorted(
            f'{ADDRESSES[host]}:{p}' for p in ports), host
      outcomes = _intrude(hosts, spec, work)
      timings['intruder'] = time.monotonic() - started
      assert len(outcomes) == 6, outcomes
      for address, outcome in outcomes.items():
        assert outcome['courier'] != 'answered', (address, outcome)
        assert not outcome['tls'].startswith('answered'), (address, outcome)
      assert not os.path.exists(os.path.join(work, 'intruder-ran'))

      # (c) A lost host: everything on C killed. The run goes on without it, and the
      # records say two of three actors serve.
      assert hosts.kill_host('c') >= 2  # launcher, actor node, its child
      lost = cluster.next_record(lambda r: r.get('actors_serving') == 2,
                                 'the records to show C lost', 30)
      more = cluster.next_record(lambda r: r['env_steps'] > lost['env_steps'],
                                 'the run to go on without C', 30)
      assert more['actors_serving'] == 2 and more['actors'] == 3

      # (b) A partition: B's link down for 20 s. B's actor waits, then resumes in the
      # same process.
      hosts.link('b', up=False)
      cut = time.monotonic()
      during = cluster.next_record(lambda r: r.get('actors_serving') == 1,
                                   'the progress log to show B gone', 15)
      time.sleep(max(0.0, 20 - (time.monotonic() - cut)))
      hosts.link('b', up=True)
      healed = time.monotonic()
      back = cluster.next_record(lambda r: r.get('actors_serving') == 2,
                                 'B\'s actor to serve again', 60)
      timings['partition_resume_after_link_up'] = time.monotonic() - healed
      assert during['env_steps'] < back['env_steps']
      assert back['actor_restarts'] == serving['actor_restarts'] == 0

      # (b, long) A partition longer than TCP's retransmission limit, the one timeout
      # on this path (Courier sets no deadline, no supervisor or launcher watches the
      # network; tcp_retries2, ~15 min by default, here 3 retransmissions, ~3 s, in
      # A's and B's kernels): A's end gives up what it was sending; B resumes when
      # the link is back, in the same process.
      for host in 'ab':
        assert hosts.wait(hosts.run(host, ['sysctl', '-qw', 'net.ipv4.tcp_retries2=3']),
                          10) == 0
      hosts.link('b', up=False)
      cluster.next_record(lambda r: r.get('actors_serving') == 1, 'B gone again', 15)
      time.sleep(20)
      hosts.link('b', up=True)
      healed = time.monotonic()
      cluster.next_record(lambda r: r.get('actors_serving') == 2, 'B back again', 60)
      timings['long_partition_resume_after_link_up'] = time.monotonic() - healed

      # (d) The central host preempted: every process on A killed (launcher,
      # supervisors, the central node, replay, actor/0), after a checkpoint. Its
      # launcher run again resumes from the checkpoint; B's actor attaches to the new
      # central node in the process it ran in.
      cluster.wait_for('a checkpoint', lambda: checkpointed_learner_step(cluster.logdir),
                       60)
      assert hosts.kill_host('a') >= 5
      cluster.launch('a', replicas['a'])
      preempted = time.monotonic()
      resumed = cluster.wait_for('the resume', lambda: next(
          (e for e in cluster.events() if e.startswith('resumed from checkpoint')), None),
          300)
      cluster.next_record(lambda r: r.get('actors_serving') == 2, 'A\'s and B\'s actors',
                          120, after=len(cluster.records()))
      timings['central_host_back'] = time.monotonic() - preempted
      log = cluster.replica_log('b', 'actor/1')
      assert log.count('started child process') == 1, log[-2000:]  # never restarted

      # (c, rejoin) C's launcher run again: its actor and the evaluator join the run,
      # which then reaches its target.
      cluster.launch('c', rejoin_c)
      rejoined = time.monotonic()
      cluster.next_record(lambda r: r.get('actors_serving') == 3 and
                          r.get('evaluator_serving'), 'C to rejoin', 240)
      timings['rejoin'] = time.monotonic() - rejoined
      log = cluster.log_with('c', 'evaluator/0', '(courier)', 10)
      assert 'shared memory offered but not attached' in log, log[-2000:]
      assert 'requests through shared memory' not in log
      summary = cluster.wait_for('the run to end', cluster.summary, 300)
      for host, n in (('a', 1), ('b', 0), ('c', 1)):
        assert hosts.wait(cluster.launches[host][n], 60) == 0, host
      timings['total'] = time.monotonic() - started
  finally:
    leftovers = leftover_processes(cluster.tag) if 'cluster' in locals() else []
    shutil.rmtree(tmp, ignore_errors=True)
  print('timings', {k: round(v) for k, v in timings.items()})
  assert summary['stop']['kind'] == 'eval_target' and summary['stop']['value'] >= 0.9
  assert summary['transports'] == {'actor/0': 'shm', 'actor/1': 'courier',
                                   'actor/2': 'courier', 'evaluator/0': 'courier'}
  assert summary['actors'] == 3 and summary['actor_restarts'] == 0
  assert summary['resumed_from_learner_step'] is not None, resumed
  assert not leftovers, leftovers
  # B's launcher ran the whole test: its endpoint refused X's handshakes (a Courier
  # channel's tries and one TLS try) and no one else dials B's actor. A's second
  # launcher let the run's own in (B's and C's dials to the central node and replay).
  def endpoint(log):
    with open(log) as f:
      return json.loads(f.read().split('TLS endpoint ')[1].split('\n')[0].replace("'", '"'))
  seen_b, seen_a = endpoint(cluster.launcher_log('b')), endpoint(cluster.launcher_log('a', 1))
  assert seen_b['refused'] >= 2 and seen_b['accepted'] == 0, seen_b
  assert seen_a['accepted'] >= 2 and seen_a['refused'] == 0, seen_a


@pytest.mark.long('learns Catch to 0.9 across emulated hosts that cannot make namespaces: ~2 min')
@pytest.mark.timeout(600)
def test_catch_across_hosts_without_namespaces_refuses_a_stranger(tmp_path):
  """Issue 64: hosts where no namespace can be made (each launcher under
  scripts/without_namespaces). Each host keeps its replicas' servers on loopback (the
  interposer) with the run's TLS endpoint on its spec address, as with namespaces:
  every listener is loopback or the endpoint's own port, host X is refused at the
  handshake on every port, and the run learns Catch to 0.9 (greedy)."""
  _need_hosts_and_xmanager()
  a, b = ADDRESSES['a'], ADDRESSES['b']
  spec = {'replay': [f'{a}:7000'], 'learner': [f'{a}:7001'],
          'actor': [f'{a}:7100', f'{b}:7100'], 'evaluator': [f'{b}:7101']}
  replicas = {'a': 'replay/0,learner/0,actor/0', 'b': 'actor/1,evaluator/0'}
  work, tmp = str(tmp_path), tmpdir_without_underscore('seedacmenons')
  try:
    with EmulatedHosts(['a', 'b', 'x'], agent_log=os.path.join(work, 'agent.log')) as hosts:
      cluster = Cluster(hosts, work, tmp, spec, [
          'catch', 'vtrace', '2', '8', '--max_seconds', '400', '--target_return', '0.9',
          '--target_on', 'eval', '--progress_interval_s', '3'])
      for host, names in replicas.items():
        cluster.launch(host, names, prefix=WITHOUT_NAMESPACES)
      serving = cluster.next_record(lambda r: r.get('actors_serving') == 2,
                                    'every actor to serve', 300, after=0)
      assert serving['actors_courier'] == 1, serving  # B's, through both endpoints
      for host, ports in (('a', (7000, 7001, 7100)), ('b', (7100, 7101))):
        with open(cluster.launcher_log(host)) as f:
          assert 'cluster: isolation: loopback (namespace: ' in f.read(), host
        listening = _listening(hosts, host, work)
        endpoint = [f'{ADDRESSES[host]}:{p}' for p in ports]
        others = [a for a in listening if a not in endpoint and not
                  a.startswith(('127.0.0.1:', '[::ffff:127.0.0.1]:', '[::1]:'))]
        assert not others and set(endpoint) <= set(listening), (host, listening)
      outcomes = _intrude(hosts, spec, work)
      assert len(outcomes) == 5, outcomes
      for address, outcome in outcomes.items():
        assert outcome['courier'] != 'answered', (address, outcome)
        assert not outcome['tls'].startswith('answered'), (address, outcome)
      assert not os.path.exists(os.path.join(work, 'intruder-ran'))
      summary = cluster.wait_for('the run to end', cluster.summary, 400)
      for host in 'ab':
        assert hosts.wait(cluster.launches[host][0], 60) == 0, host
  finally:
    leftovers = leftover_processes(cluster.tag) if 'cluster' in locals() else []
    shutil.rmtree(tmp, ignore_errors=True)
  assert summary['stop']['kind'] == 'eval_target' and summary['stop']['value'] >= 0.9
  assert not leftovers, leftovers


# ~3 min alone (177 s at load 2-5): with the Catch program (~2.5 min) the two exceed the
# ~3 minutes issue 37 allows the suite, so this one runs with the slow tests.
@pytest.mark.skipif(not os.environ.get('SEEDACME_SLOW_TESTS'),
                    reason='before a release: 3-5 minutes more; set SEEDACME_SLOW_TESTS=1')
@pytest.mark.long('R2D2 across emulated hosts through a replay partition: 2.5 min')
@pytest.mark.timeout(600)
def test_r2d2_waits_out_a_partition_of_its_replay_host(tmp_path):
  """(e) R2D2 with the replay node alone on host D, D's link down for 20 s: the
  learner's dataset says the server is away and waits; the central node's writer keeps
  the sequences it holds (its queue, then inference waits: nothing dropped) and says
  so; both go on when D is back, with nothing restarted."""
  _need_hosts_and_xmanager()
  work, tmp = str(tmp_path), tmpdir_without_underscore('seedacmecluster')
  try:
    with EmulatedHosts(['a', 'd'], agent_log=os.path.join(work, 'agent.log')) as hosts:
      a, d = hosts.addresses['a'], hosts.addresses['d']
      spec = {'replay': [f'{d}:7000'], 'learner': [f'{a}:7001'],
              'actor': [f'{a}:7100', f'{a}:7101']}
      cluster = Cluster(hosts, work, tmp, spec, [
          'catch', 'r2d2', '2', '8', '--num_eval_envs', '0', '--max_seconds', '150',
          '--progress_interval_s', '3'])
      cluster.launch('d', 'replay/0')
      cluster.launch('a', 'learner/0,actor/0,actor/1')
      learning = cluster.next_record(lambda r: r['learner_steps'] > 0, 'learning', 300,
                                     after=0)
      hosts.link('d', up=False)
      cut = time.monotonic()
      away = cluster.next_record(lambda r: r['replay_size'] is None, 'replay away', 15)
      time.sleep(max(0.0, 20 - (time.monotonic() - cut)))
      stalled = cluster.records()[-1]
      hosts.link('d', up=True)
      healed = time.monotonic()
      back = cluster.next_record(
          lambda r: r['replay_size'] is not None and r['learner_steps'] > stalled['learner_steps'],
          'learning to go on', 90)
      resume_s = time.monotonic() - healed
      summary = cluster.wait_for('the run to end', cluster.summary, 300)
      codes = {h: hosts.wait(cluster.launches[h][0], 60) for h in 'ad'}
      central = cluster.replica_log('a', 'learner/0')
      replay = cluster.replica_log('d', 'replay/0')
  finally:
    leftovers = leftover_processes(cluster.tag) if 'cluster' in locals() else []
    shutil.rmtree(tmp, ignore_errors=True)
  print('resumed', round(resume_s), 's after the link came back')
  assert learning['replay_size'] is not None and stalled['replay_size'] is None, away
  # The writer holds what it could not deliver (its queue; inference then waits):
  # buffered, not dropped. The learner went on once D was back.
  assert stalled['trajectory_writer_pending'] > 0, stalled
  assert back['learner_steps'] > stalled['learner_steps']
  # The dataset and the writer said the server was away, and that it came back.
  assert 'unreachable while sampling' in central and 'sampling again after' in central
  assert 'unconfirmed items kept; reconnecting' in central
  assert 'reachable again after' in central
  # Nothing restarted: one child per supervisor, and the run ended by its budget.
  assert central.count('started child process') == 1, central[-3000:]
  assert replay.count('started child process') == 1, replay[-3000:]
  assert summary['stop']['kind'] == 'time' and summary['actor_restarts'] == 0
  assert codes == {'a': 0, 'd': 0}, codes
  assert not leftovers, leftovers
