"""The Vertex AI executables run for real (`launchers/emulation.py`): `vertex.py
--emulate` starts every replica of every worker pool from its copied code directory with
a loopback CLUSTER_SPEC, and `cluster.py` (own machines) starts each host's share of the
replicas of one cluster spec -- here two launchers on one machine playing two hosts."""

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid

import pytest

from tests.integration.launch import (TAG_VAR, WITHOUT_NAMESPACES, leftover_processes,
                                      target_value, tmpdir_without_underscore)

pytestmark = pytest.mark.integration


@pytest.mark.long('Vertex executables learn Catch to 0.9: ~70 s, up to 5 min under load')
@pytest.mark.timeout(330)
def test_emulated_vertex_job_trains_catch_behind_each_replicas_guard(tmp_path):
  """Issue 64: the Vertex path as a real job runs it, on a host without namespaces
  (scripts/without_namespaces): every replica an emulated container behind the replica
  guard (its own address and loopback, the job's slot leaves). A stranger's address is
  refused at every replica's endpoint (raw bytes, another job's leaf, a leaf of this job
  copied to it); the job learns Catch to 0.9, every replica exits 0, the job's
  credentials are gone afterwards."""
  _need_xmanager()
  from seedacme.wire import tls_tunnel  # pylint: disable=g-import-not-at-top
  tag = uuid.uuid4().hex
  tmp = tmpdir_without_underscore('seedacmetest')
  logdir = tmp_path / 'logdir'
  env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path), **{TAG_VAR: tag})
  proc = subprocess.Popen(
      [*WITHOUT_NAMESPACES, sys.executable, '-m', 'seedacme.launchers.vertex', 'catch',
       'vtrace', '2', '8', '--accelerator', 'none', '--emulate', '--max_seconds', '240',
       '--target_return', '0.9', '--logdir', str(logdir), '--learner_cpu', '2',
       '--actor_cpu', '1', '--replay_cpu', '1', '--progress_interval_s', '3'],
      cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    endpoints = _wait_for_learning(logdir)
    foreign = tmp_path / 'foreign'
    tls_tunnel.issue_slot_credentials(str(foreign), {'workerpool1': 1}, 'another job')
    [store] = [p for p in (logdir / 'tls').iterdir() if p.name.startswith('job-')]
    outcomes = {}
    for slot, (address, port) in endpoints.items():
      outcomes[slot] = {
          'raw': _stranger(address, port),
          'another job': _stranger(address, port, foreign / 'workerpool1-0'),
          'copied leaf': _stranger(address, port, store / slot.replace('/', '-')),
      }
    out = proc.communicate(timeout=280)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
    leftovers = leftover_processes(tag)
    left = [n for n in os.listdir(tmp) if not n.startswith('__autograph')]
    shutil.rmtree(tmp)
  assert proc.returncode == 0, out[-3000:]
  assert not leftovers, leftovers
  assert len(endpoints) == 5, endpoints  # replay, learner, 2 actors, evaluator
  for slot, tried in outcomes.items():
    for who, outcome in tried.items():
      assert outcome != 'answered', (slot, who, outcome)
  codes = eval(re.search(r'replicas ended: (\{.*\})', out).group(1))  # pylint: disable=eval-used
  assert len(codes) == 5 and set(codes.values()) == {0}, codes
  logs = ''.join(open(logdir / 'replicas' / n).read() for n in os.listdir(logdir / 'replicas'))
  assert 'from the checkout' not in logs
  refused = [json.loads(m.replace("'", '"')) for m in
             re.findall(r'replica ended with 0; TLS endpoint (\{.*\})', logs)]
  assert len(refused) == 5 and all(r['refused'] >= 3 for r in refused), refused
  assert all(r['refused_address_mismatch'] >= 1 for r in refused), refused
  assert 'the job\'s credentials removed' in logs and not store.exists()
  summary = json.load(open(logdir / 'summary.json'))
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary['stop']
  assert target_value(summary) >= 0.9
  assert not left, left  # executables' and staged code's temp dirs removed


def _wait_for_learning(logdir, timeout_s=240.0):
  """{slot: (address, port)} of every replica's endpoint, once the learner has
  stepped (every replica's guard said where its endpoint listens)."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    time.sleep(1)
    try:
      records = [json.loads(x) for x in open(logdir / 'progress.jsonl') if x.strip()]
    except (OSError, ValueError):
      continue
    if not any(r.get('learner_steps') for r in records):
      continue
    endpoints = {}
    for name in os.listdir(logdir / 'replicas'):
      found = re.search(r'replica_guard (\S+): isolation: loopback .* mutual TLS on (\S+) '
                        r'ports \[(\d+)\]', open(logdir / 'replicas' / name).read())
      if found:
        endpoints[found.group(1)] = (found.group(2), int(found.group(3)))
    return endpoints
  raise AssertionError(f'no learner step within {timeout_s:g}s')


def _stranger(address, port, leaf=None):
  """What a stranger's address (127.0.3.1) gets from an endpoint: an HTTP/2 preface,
  through TLS with `leaf` (`<leaf>.cert.pem`/`.key.pem`) if given."""
  preface = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
  try:
    with socket.create_connection((address, port), timeout=5,
                                  source_address=('127.0.3.1', 0)) as s:
      conn = s
      if leaf is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(f'{leaf}.cert.pem', f'{leaf}.key.pem')
        conn = ctx.wrap_socket(s)
      conn.sendall(preface)
      return 'answered' if conn.recv(64) else 'closed'
  except (OSError, ssl.SSLError) as e:
    return type(e).__name__


def _need_xmanager() -> None:
  """Skip without xmanager, unless CI requires the Vertex path (SEEDACME_REQUIRE_VERTEX=1)."""
  if os.environ.get('SEEDACME_REQUIRE_VERTEX') == '1':
    import xmanager  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  else:
    pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')


@pytest.mark.skipif(not os.environ.get('SEEDACME_SLOW_TESTS'),
                    reason='before a release: 3.5 minutes more; set SEEDACME_SLOW_TESTS=1')
@pytest.mark.long('two launchers of one cluster spec learn Catch to 0.9: ~3.5 min; '
                  'test_emulated_cluster runs the same command per host, in namespaces')
@pytest.mark.timeout(330)
def test_two_hosts_from_one_cluster_spec_train_catch_together(tmp_path):
  # Two "hosts": two own-machines launchers, the same command and cluster spec, each
  # starting its own replicas -- the central node and replay on one, actors and
  # evaluator on the other.
  _need_xmanager()
  import portpicker  # pylint: disable=g-import-not-at-top
  tag = uuid.uuid4().hex
  logdir = tmp_path / 'logdir'
  ports = [portpicker.pick_unused_port() for _ in range(5)]
  spec = {'replay': [f'127.0.0.1:{ports[0]}'], 'learner': [f'127.0.0.1:{ports[1]}'],
          'actor': [f'127.0.0.1:{p}' for p in ports[2:4]], 'evaluator': [f'127.0.0.1:{ports[4]}']}
  spec_file = tmp_path / 'cluster.json'
  spec_file.write_text(json.dumps(spec))
  hosts = {'a': 'replay/0,learner/0', 'b': 'actor/0,actor/1,evaluator/0'}
  procs, tmps = {}, []
  try:
    for host, replicas in hosts.items():
      tmp = tmpdir_without_underscore('seedacmetest')
      tmps.append(tmp)
      env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path), **{TAG_VAR: tag})
      procs[host] = subprocess.Popen(
          [sys.executable, '-m', 'seedacme.launchers.cluster', 'catch', 'vtrace', '2', '8',
           '--max_seconds', '240', '--target_return', '0.9', '--logdir', str(logdir),
           '--cluster_spec', f'@{spec_file}', '--replicas', replicas,
           '--replica_logs', str(tmp_path / f'replicas_{host}')],
          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
          text=True)
    outs = {host: p.communicate(timeout=300)[0] for host, p in procs.items()}
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
    leftovers = leftover_processes(tag)
    for tmp in tmps:
      shutil.rmtree(tmp, ignore_errors=True)
  for host, p in procs.items():
    assert p.returncode == 0, outs[host][-3000:]
    assert f'cluster: {len(hosts[host].split(","))} of 5 replicas' in outs[host], outs[host]
    codes = eval(re.search(r'replicas ended: (\{.*\})', outs[host]).group(1))  # pylint: disable=eval-used
    assert set(codes) == set(hosts[host].split(',')) and set(codes.values()) == {0}, codes
    logs = tmp_path / f'replicas_{host}'
    assert 'from the checkout' not in ''.join(open(logs / n).read() for n in os.listdir(logs))
  assert not leftovers, leftovers
  summary = json.load(open(logdir / 'summary.json'))
  assert target_value(summary) >= 0.9, summary['stop']
