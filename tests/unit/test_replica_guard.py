"""A Vertex job's replicas behind the replica guard (issue 64, item 3): leaves naming
replica slots, issued at submission; each replica's endpoint on its own address relaying
to servers on its own loopback. Two emulated containers on distinct 127/8 addresses need
no namespace, so these run on any host."""

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time

import portpicker
import pytest

from seedacme.wire import replica_guard, tls_tunnel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two emulated containers (address, own loopback) and a stranger's address.
A, A_LO, B, B_LO, STRANGER_IP = '127.0.1.1', '127.0.2.1', '127.0.1.2', '127.0.2.2', '127.0.3.1'


def _spec():
  return {'wp0': [f'{A}:{portpicker.pick_unused_port()}'],
          'wp1': [f'{B}:{portpicker.pick_unused_port()}']}


def _backend(address, port, seen):
  """B's replica's server: upper-cases what it reads, counts connections and bytes."""
  server = socket.create_server((address, port))

  def serve():
    while True:
      try:
        conn, _ = server.accept()
      except OSError:
        return
      seen.append(0)
      with conn:
        while data := conn.recv(1024):
          seen[-1] += len(data)
          conn.sendall(data.upper())
  threading.Thread(target=serve, daemon=True).start()
  return server


def _client_ctx(cert=None, key=None):
  ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
  ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
  if cert:
    ctx.load_cert_chain(cert, key)
  return ctx


def _intrude(port, ctx=None):
  """From the stranger's address: the outcome of sending bytes (through TLS if `ctx`)."""
  try:
    with socket.create_connection((B, port), timeout=5, source_address=(STRANGER_IP, 0)) as s:
      conn = ctx.wrap_socket(s) if ctx else s
      conn.sendall(b'hello')
      return 'answered' if conn.recv(64) else 'closed'
  except (OSError, ssl.SSLError) as e:
    return type(e).__name__


def test_slot_leaves_carry_a_job_between_containers_and_refuse_strangers(tmp_path):
  spec = _spec()
  store = str(tmp_path / 'store')
  tls_tunnel.issue_slot_credentials(store, {'wp0': 1, 'wp1': 1}, 'job', 3600.0)
  assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
  assert {stat.S_IMODE(os.stat(os.path.join(store, n)).st_mode)
          for n in os.listdir(store)} == {0o600}
  leaf = tls_tunnel.load_cert(os.path.join(store, 'wp1-0.cert.pem'))
  assert str(leaf.subject).endswith('wp1-0.replica.seedacme.invalid)>'), leaf.subject

  plan_a, local_a = tls_tunnel.slot_plan(spec, ('wp0', 0), A_LO)
  plan_b, local_b = tls_tunnel.slot_plan(spec, ('wp1', 0), B_LO)
  assert local_b['wp1'] == [f'{B_LO}:{plan_b.inbound[0]}'] and plan_b.address == B
  [alias] = plan_a.outbound
  assert plan_a.server_names == {alias: 'wp1-0.replica.seedacme.invalid'}
  assert local_a['wp1'] == [f'{A_LO}:{alias}']

  seen = []
  backend = _backend(B_LO, plan_b.inbound[0], seen)
  work_a, work_b = tmp_path / 'a', tmp_path / 'b'
  work_a.mkdir(mode=0o700)
  work_b.mkdir(mode=0o700)
  a = tls_tunnel.Tunnel(plan_a, tls_tunnel.fetch_slot_credentials(store, 'wp0', 0, str(work_a)),
                        'loopback')
  b = tls_tunnel.Tunnel(plan_b, tls_tunnel.fetch_slot_credentials(store, 'wp1', 0, str(work_b)),
                        'loopback')
  try:
    # A's replica reaches B's through both endpoints.
    with socket.create_connection((A_LO, alias), timeout=10) as c:
      c.sendall(b'hello')
      assert c.recv(64) == b'HELLO'
    # Another job's leaf for the same slot, a self-signed one, none, A's leaf copied to
    # the stranger's address, and no TLS at all: refused at B's endpoint.
    other = str(tmp_path / 'other')
    tls_tunnel.issue_slot_credentials(other, {'wp0': 1}, 'another job', 3600.0)
    outcomes = {
        'raw bytes': _intrude(plan_b.inbound[0]),
        'no certificate': _intrude(plan_b.inbound[0], _client_ctx()),
        "another job's leaf": _intrude(plan_b.inbound[0], _client_ctx(
            os.path.join(other, 'wp0-0.cert.pem'), os.path.join(other, 'wp0-0.key.pem'))),
        "A's leaf from another address": _intrude(plan_b.inbound[0], _client_ctx(
            os.path.join(store, 'wp0-0.cert.pem'), os.path.join(store, 'wp0-0.key.pem'))),
    }
    time.sleep(0.5)
    for who, outcome in outcomes.items():
      assert outcome != 'answered', (who, outcome)
    assert len(seen) == 1 and seen[0] == len('hello'), seen  # only A's bytes got through
    counters = b.counters.as_dict()
    assert counters['refused'] >= 4 and counters['refused_address_mismatch'] == 1, counters
    assert counters['refused_bad_certificate'] >= 2, counters
  finally:
    a.close()
    b.close()
    backend.close()


def test_address_checks_follow_the_slots_spec_host():
  slots = {'wp0-0.replica.seedacme.invalid': '127.0.1.1',
           'wp1-0.replica.seedacme.invalid': 'localhost'}
  cert = {'subjectAltName': (('DNS', 'wp0-0.replica.seedacme.invalid'),)}
  assert tls_tunnel.address_problem('127.0.1.1', cert, slots) is None
  assert 'connects from 127.0.3.1' in tls_tunnel.address_problem('127.0.3.1', cert, slots)
  by_name = {'subjectAltName': (('DNS', 'wp1-0.replica.seedacme.invalid'),)}
  assert tls_tunnel.address_problem('127.0.0.1', by_name, slots) is None  # resolved now
  foreign = {'subjectAltName': (('DNS', 'wp7-0.replica.seedacme.invalid'),)}
  assert 'no replica of this job' in tls_tunnel.address_problem('127.0.1.1', foreign, slots)
  with pytest.raises(tls_tunnel.TunnelError, match='gives 127.0.1.1:7000 to wp0/0 and wp1/0'):
    tls_tunnel.slot_plan({'wp0': ['127.0.1.1:7000'], 'wp1': ['127.0.1.1:7000']}, ('wp0', 0))


def test_a_store_others_can_read_is_refused(tmp_path):
  store = str(tmp_path / 'store')
  tls_tunnel.issue_slot_credentials(store, {'wp0': 1}, 'job')
  os.chmod(os.path.join(store, 'wp0-0.key.pem'), 0o644)
  work = tmp_path / 'w'
  work.mkdir(mode=0o700)
  with pytest.raises(tls_tunnel.TunnelError, match='wp0-0.key.pem'):
    tls_tunnel.fetch_slot_credentials(store, 'wp0', 0, str(work))
  with pytest.raises(tls_tunnel.TunnelError, match='exists already'):
    tls_tunnel.issue_slot_credentials(store, {'wp0': 1}, 'job')


def test_the_guard_refuses_to_start_a_replica_it_cannot_authenticate(tmp_path):
  def guard(env, manifest):
    return subprocess.run(
        [sys.executable, '-m', 'seedacme.wire.replica_guard', '--manifest', manifest, '--',
         'python', '-c', 'print("the replica ran")'], capture_output=True, text=True,
        timeout=60, cwd=str(tmp_path), env={**os.environ, 'PYTHONPATH': REPO, **env})
  spec = json.dumps({'cluster': _spec(), 'task': {'type': 'wp1', 'index': 0}})
  no_spec = guard({}, 'm.json')
  manifest = replica_guard.write_manifest(str(tmp_path), str(tmp_path / 'store'), 'job',
                                          'wp0/0', None)
  no_store = guard({'CLUSTER_SPEC': spec}, manifest)
  other_task = guard({'CLUSTER_SPEC': json.dumps({'cluster': {}, 'task': {'type': 'x'}})},
                     manifest)
  for done in (no_spec, no_store, other_task):
    assert done.returncode == 2 and 'the replica ran' not in done.stdout, done
    assert done.stderr.startswith('replica_guard: refusing to start the replica: ')
  assert 'CLUSTER_SPEC' in no_spec.stderr
  assert "wp1/0 cannot use the job's credentials" in no_store.stderr
  assert 'CLUSTER_SPEC' in other_task.stderr


@pytest.mark.needs_other_uid
@pytest.mark.timeout(60)
def test_an_alias_port_refuses_another_local_uid(tmp_path):
  """On a loopback every local user shares, an alias (A's way out through its leaf)
  admits only this uid's processes: another uid's connection is counted and closed."""
  spec = _spec()
  store = str(tmp_path / 'store')
  tls_tunnel.issue_slot_credentials(store, {'wp0': 1, 'wp1': 1}, 'job', 3600.0)
  plan_a, _ = tls_tunnel.slot_plan(spec, ('wp0', 0), A_LO)
  work = tmp_path / 'a'
  work.mkdir(mode=0o700)
  a = tls_tunnel.Tunnel(plan_a, tls_tunnel.fetch_slot_credentials(store, 'wp0', 0, str(work)),
                        'loopback')
  [alias] = plan_a.outbound
  # Started as root (the interpreter is under root's home), then uid 65534 for good.
  dial = ('import os, socket, encodings.idna\n'
          'os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n'
          f's = socket.create_connection(("{A_LO}", {alias}), timeout=10)\n'
          's.sendall(b"hello")\n'
          'print("answered" if s.recv(64) else "closed", os.geteuid())\n')
  try:
    done = subprocess.run([sys.executable, '-c', dial], capture_output=True, text=True,
                          timeout=30, cwd='/')
    deadline = time.monotonic() + 10
    while a.counters.refused_by['local_uid'] < 1 and time.monotonic() < deadline:
      time.sleep(0.05)
    counters = a.counters.as_dict()
  finally:
    a.close()
  assert done.stdout.split() == ['closed', '65534'] or 'Reset' in done.stderr, done
  assert counters['refused_local_uid'] == 1 and counters['loop_errors'] == 0, counters
