"""The run's TLS credentials (`seedacme.wire.tls_tunnel`, issue 62 items 2 and 3).

What a shared cluster's other users and a copy of the logdir must not get: a CA planted
in `<logdir>/tls` by another uid (`setpriv`, in a directory shaped like /tmp) or a
`<logdir>/tls` others can enter is refused by name; the CA key is on no disk once the
set is made (every PEM under the logdir and the work dir loaded and compared); a set
lasts the run's time budget plus a day, is renewed by the central node's host only and
removed by it when the run ends. With host names in the spec, a leaf names the
addresses they resolve to and a leaf copied to another address is refused at the
endpoint, as is a user's DNS-only leaf there (checked by resolution): end to end in a
namespace whose /etc/hosts this test writes.
"""

import datetime
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import textwrap

import portpicker
import pytest

from seedacme.wire import tls_tunnel
from seedacme.wire.tls_tunnel import TunnelError
from tests.emulated_hosts import skip_reason

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OTHER = 65534
HOSTS = ['10.0.0.1', '10.0.0.2', '10.0.0.3']
DAY = 86400.0


def _cert(path: str):
  return tls_tunnel.load_cert(path)  # pylint: disable=protected-access


def _left_s(path: str) -> float:
  ends = _cert(path).not_valid_after_utc
  return (ends - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def _peer_cert(path: str) -> dict:
  """The certificate at `path` as `SSLSocket.getpeercert()` gives it to the endpoint."""
  return ssl._ssl._test_decode_cert(path)  # pylint: disable=protected-access


def _creds(logdir, address='10.0.0.1', work=None, **kwargs):
  return tls_tunnel.host_credentials(str(logdir), None, address, 'run',
                                     str(work or tempfile.mkdtemp()), **kwargs)


# ---- Another user's tls dir, and ours when others can enter it


@pytest.fixture
def shared():
  """A directory like /tmp: root's, world-writable, sticky; removed after."""
  path = tempfile.mkdtemp(prefix='seedacmeshared', dir='/tmp')
  os.chmod(path, 0o1777)
  yield path
  shutil.rmtree(path, ignore_errors=True)


@pytest.mark.needs_other_uid
@pytest.mark.parametrize('logdir_of', ['theirs', 'ours, others can write into it'])
def test_a_tls_dir_planted_by_another_uid_is_refused_naming_its_owner(shared, logdir_of,
                                                                      tmp_path):
  # The planted CA, in this code's layout and the earlier one's (`tls/ca.pem` and
  # `ca.key`): made here, copied in by uid 65534 (who cannot run this venv's python).
  source = os.path.join(shared, 'planted')
  tls_tunnel.ensure_run_credentials(source, HOSTS, 'planted')
  tls_tunnel.make_ca(source, 'planted')
  subprocess.run(['chmod', '-R', 'a+rX', source], check=True)
  logdir = os.path.join(shared, 'run')
  if logdir_of != 'theirs':
    os.mkdir(logdir)
    os.chmod(logdir, 0o777)
  plant = (f'mkdir -p {logdir} && mkdir -m 700 {logdir}/tls && '
           f'cp -r {source}/. {logdir}/tls/ && chmod -R go-rwx {logdir}/tls')
  done = subprocess.run(['setpriv', f'--reuid={OTHER}', f'--regid={OTHER}',
                         '--clear-groups', 'sh', '-c', plant], capture_output=True, text=True,
                        timeout=30, check=False)
  assert done.returncode == 0, done.stderr
  work = tmp_path / 'work'
  work.mkdir()
  with pytest.raises(TunnelError,
                     match=f'{logdir}/tls belongs to nobody \\(uid {OTHER}\\), not to this '
                     'user'):
    tls_tunnel.host_credentials(logdir, None, '10.0.0.1', 'run', str(work))
  assert not os.listdir(work)  # no leaf issued from the planted CA


def test_a_tls_dir_others_can_enter_or_a_key_others_can_read_is_refused(tmp_path):
  logdir = tmp_path / 'logdir'
  first = _creds(logdir)
  tls = str(logdir / 'tls')
  os.chmod(tls, 0o755)
  with pytest.raises(TunnelError, match=f'{tls} has mode 0755: others can read or enter'):
    _creds(logdir)
  os.chmod(tls, 0o700)
  assert _creds(logdir) == first
  keys = [os.path.join(here, name) for here, _, files in os.walk(tls) for name in files
          if name.endswith(('.key', 'key.pem'))]
  assert keys
  for key in keys:
    os.chmod(key, 0o644)
  with pytest.raises(TunnelError, match='key.pem has mode 0644: others can read it'):
    _creds(logdir)
  for key in keys:
    os.chmod(key, 0o600)
  os.chmod(os.path.dirname(first.ca), 0o750)  # the set's own directory
  with pytest.raises(TunnelError, match='has mode 0750'):
    _creds(logdir)


def test_a_set_for_other_hosts_or_a_broken_one_is_refused(tmp_path):
  creds = _creds(tmp_path, hosts=HOSTS)
  target = os.path.dirname(creds.ca)
  with open(os.path.join(target, 'hosts.json'), 'w') as f:  # stays 0600
    json.dump({'hosts': HOSTS[:2]}, f)
  with pytest.raises(TunnelError, match=r"made for the hosts \['10.0.0.1', '10.0.0.2'\], "
                     'not the cluster spec'):
    _creds(tmp_path, hosts=HOSTS)
  with open(os.path.join(target, 'hosts.json'), 'w') as f:
    json.dump({'hosts': HOSTS}, f)
  os.remove(os.path.join(target, 'hosts', '10.0.0.3', 'key.pem'))
  with pytest.raises(TunnelError, match=f'{target} are incomplete'):
    _creds(tmp_path, hosts=HOSTS)


# ---- The CA key: in memory only


def test_the_ca_key_is_on_no_disk_once_the_credentials_are_made(tmp_path):
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  logdir, work = tmp_path / 'logdir', tmp_path / 'work'
  work.mkdir()
  cas = {_creds(logdir, work=work).ca,  # as a one-host run calls it
         *(_creds(logdir, h, work=work, hosts=HOSTS, central=h == HOSTS[0]).ca
           for h in HOSTS)}
  ca_keys = {_cert(ca).public_key().public_numbers() for ca in cas}
  leaf_keys = set()
  for here, _, files in os.walk(tmp_path):
    for name in files:
      with open(os.path.join(here, name), 'rb') as f:
        data = f.read()
      for block in data.split(b'-----END')[:-1]:
        if b'PRIVATE KEY-----' in block:
          pem = block[block.index(b'-----BEGIN'):] + b'-----END PRIVATE KEY-----\n'
          key = serialization.load_pem_private_key(pem, None)
          leaf_keys.add(key.public_key().public_numbers())
  assert len(cas) == 2 and len(leaf_keys) == 1 + len(HOSTS)  # every leaf's, and only
  assert not ca_keys & leaf_keys
  for ca in cas:  # every host's leaf is of its set's CA
    for here, _, files in os.walk(os.path.dirname(ca)):
      if 'cert.pem' in files:
        _cert(os.path.join(here, 'cert.pem')).verify_directly_issued_by(_cert(ca))


# ---- How long a set lives, who renews it, who removes it


def test_a_set_lasts_the_budget_plus_a_day_and_only_the_central_host_renews_it(
    tmp_path, monkeypatch):
  no_budget = _creds(tmp_path / 'none')
  for path in (no_budget.ca, no_budget.cert):  # 30 days without a time budget, not 365
    assert abs(_left_s(path) - 30 * DAY) < 120, path
  creds = _creds(tmp_path, hosts=HOSTS, needed_s=3600.0, central=True)
  for path in (creds.ca, creds.cert):
    assert abs(_left_s(path) - (3600 + DAY)) < 120, path
  with open(creds.ca, 'rb') as f:
    first_ca = f.read()
  # A resume that needs less than what is left reuses the set, from any host.
  again = _creds(tmp_path, HOSTS[1], hosts=HOSTS, needed_s=2 * 3600.0)
  with open(again.ca, 'rb') as f:
    assert f.read() == first_ca
  # One that needs more: another host waits for the central node's host, then says so.
  monkeypatch.setattr(tls_tunnel, 'WAIT_FOR_CENTRAL_S', 0.5)
  with pytest.raises(TunnelError, match='learner/0.*did not renew them'):
    _creds(tmp_path, HOSTS[1], hosts=HOSTS, needed_s=3 * DAY)
  renewed = _creds(tmp_path, hosts=HOSTS, needed_s=3 * DAY, central=True)
  with open(renewed.ca, 'rb') as f:
    assert f.read() != first_ca
  assert abs(_left_s(renewed.ca) - 4 * DAY) < 120
  assert os.listdir(tmp_path / 'tls') == [os.path.basename(os.path.dirname(renewed.ca))]


def test_the_central_host_removes_the_set_when_the_run_ends(tmp_path):
  why = skip_reason()
  if why is not None:
    pytest.skip(f'namespaces: {why}')
  from seedacme.launchers import emulation  # pylint: disable=g-import-not-at-top
  from seedacme.run import logdir as logdir_lib  # pylint: disable=g-import-not-at-top
  # Two hosts of one spec on this machine's loopback: each binds its own address.
  spec = {'learner': [f'127.0.0.1:{portpicker.pick_unused_port()}'],
          'actor': [f'127.0.0.2:{portpicker.pick_unused_port()}']}
  every = {('learner', 0), ('actor', 0)}
  logdir = str(tmp_path)
  opened = [emulation.open_tunnel(spec, {mine}, every, logdir, None, 'run', 'test', 600.0)
            for mine in sorted(every, reverse=True)]  # learner/0's host first
  try:
    (central, _, central_ended), (actors, _, actors_ended) = opened
    assert central.plan.address == '127.0.0.1' and actors.plan.address == '127.0.0.2'
    target = tls_tunnel.run_credentials_dir(os.path.join(logdir, 'tls'),
                                            ['127.0.0.1', '127.0.0.2'])
    central_ended()  # ended without a summary (a crash): a relaunch rejoins with it
    assert os.path.isdir(target)
    with open(os.path.join(logdir, logdir_lib.SUMMARY), 'w') as f:
      f.write('{}')
    actors_ended()
    assert os.path.isdir(target)  # not the actors' host's to remove
    central_ended()
    assert not os.path.exists(target) and os.listdir(os.path.join(logdir, 'tls')) == []
  finally:
    for tunnel, _, _ in opened:
      tunnel.close()


# ---- Host names: a leaf names their addresses; the endpoint checks the peer's


def test_a_named_host_gets_its_addresses_and_its_copied_leaf_is_refused(tmp_path):
  addresses = tls_tunnel.resolve_host('localhost')  # pylint: disable=protected-access
  assert '127.0.0.1' in addresses
  creds = _creds(tmp_path, 'localhost', hosts=['localhost', '10.0.0.2'])
  cert = _peer_cert(creds.cert)
  assert sorted(cert['subjectAltName']) == sorted(
      [('DNS', 'localhost'), *(('IP Address', _ip_text(a)) for a in addresses)])
  assert tls_tunnel.address_problem('127.0.0.1', cert) is None
  assert tls_tunnel.address_problem('::ffff:127.0.0.1', cert) is None
  problem = tls_tunnel.address_problem('127.0.0.9', cert)
  assert problem and problem.startswith('connects from 127.0.0.9, its certificate names '
                                        '127.0.0.1'), problem


def _ip_text(address: str) -> str:
  """An address as OpenSSL prints an IP SAN (IPv6: every group, uppercase)."""
  import ipaddress  # pylint: disable=g-import-not-at-top
  ip = ipaddress.ip_address(address)
  return str(ip) if ip.version == 4 else ':'.join(
      f'{int(g, 16):X}' for g in ip.exploded.split(':'))


def test_a_certificate_with_names_only_is_checked_by_what_they_resolve_to():
  by_name = {'subjectAltName': (('DNS', 'localhost'),)}
  assert tls_tunnel.address_problem('127.0.0.1', by_name) is None
  problem = tls_tunnel.address_problem('127.0.0.9', by_name)
  assert problem and 'names localhost (127.0.0.1' in problem, problem
  nowhere = {'subjectAltName': (('DNS', 'no-such-host.invalid'),)}
  assert 'resolving to nothing' in tls_tunnel.address_problem('127.0.0.1', nowhere)
  assert tls_tunnel.address_problem('127.0.0.1', {}) == \
      'its certificate names no address or host name'


def test_a_spec_host_that_is_no_name_or_does_not_resolve_is_refused(tmp_path):
  with pytest.raises(TunnelError, match="names host '../x': neither an IP address"):
    tls_tunnel.spec_hosts({'learner': ['../x:7000']})
  with pytest.raises(TunnelError, match='no-such-host.invalid does not resolve here'):
    _creds(tmp_path, 'no-such-host.invalid', hosts=['10.0.0.2'])
  assert os.listdir(tmp_path / 'tls') == []  # nothing written


# Hosts A and B named in the spec (host-a, host-b: 127.0.0.2 and .3 in the /etc/hosts
# this test mounts). B's replica reaches A's backend by name; B's leaf used from
# 127.0.0.9 is refused, from B's address accepted; a user's leaf that names host-b only
# (DNS SAN) is refused from 127.0.0.9 and accepted from B's address.
_NAMED = textwrap.dedent('''
    import datetime, json, os, socket, ssl, subprocess, sys, tempfile, time
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from seedacme.wire import tls_tunnel as tt
    work = sys.argv[1]
    spec = {'learner': ['host-a:7001'], 'actor': ['host-b:7100']}
    hosts = tt.spec_hosts(spec)
    creds = {h: tt.host_credentials(work, None, h, 'run1', tempfile.mkdtemp(dir=work),
                                    hosts, 600.0, h == 'host-a') for h in hosts}
    a = tt.Tunnel(tt.plan(spec, [('learner', 0)])[0], creds['host-a'])
    b = tt.Tunnel(tt.plan(spec, [('actor', 0)])[0], creds['host-b'])
    backend = subprocess.Popen(a.prefix() + [sys.executable, '-c', """
    import socket, threading
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('127.0.0.1', 7001)); s.listen()
    def serve(c):
      while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d.upper())
    while True:
      c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
    """])
    result = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # B's replica dials A's learner at its alias
      got = subprocess.run(b.prefix() + [sys.executable, '-c', (
          "import socket; c = socket.create_connection(('127.0.0.1', 7001), timeout=5); "
          "c.sendall(b'hello'); print(c.recv(100).decode())")],
          capture_output=True, text=True, timeout=30)
      if got.stdout.strip():
        break
      time.sleep(0.3)
    result['through'] = got.stdout.strip()

    def ctx(cert, key):
      c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
      c.check_hostname, c.verify_mode = False, ssl.CERT_NONE
      c.load_cert_chain(cert, key)
      return c

    def attempt(tunnel, port, context, source):
      before = dict(tunnel.counters.as_dict())
      s = socket.create_connection(('127.0.0.2', port), timeout=5,
                                   source_address=(source, 0))
      try:
        s = context.wrap_socket(s, server_hostname='host-a')
        s.sendall(b'ping')
        s.recv(100)
      except (ssl.SSLError, OSError):
        pass
      finally:
        s.close()
      time.sleep(0.5)
      after = tunnel.counters.as_dict()
      return {k: after[k] - before[k] for k in ('refused', 'accepted')}

    b_leaf = ctx(creds['host-b'].cert, creds['host-b'].key)
    result['run leaf of host-b from 127.0.0.9'] = attempt(a, 7001, b_leaf, '127.0.0.9')
    result['run leaf of host-b from 127.0.0.3'] = attempt(a, 7001, b_leaf, '127.0.0.3')

    # A user's own CA (--tls_dir) on A, and a leaf of it that names host-b only.
    user = tempfile.mkdtemp(dir=work)
    tt.make_ca(user, 'user')
    with open(os.path.join(user, 'ca.key'), 'rb') as f:
      ca_key = serialization.load_pem_private_key(f.read(), None)
    with open(os.path.join(user, 'ca.pem'), 'rb') as f:
      ca_cert = x509.load_pem_x509_certificate(f.read())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    leaf = (x509.CertificateBuilder().subject_name(
                x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, 'user leaf')]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName('host-b')]), False)
            .sign(ca_key, hashes.SHA256()))
    dns_only = tempfile.mkdtemp(dir=work)
    for name, data in (('cert.pem', leaf.public_bytes(serialization.Encoding.PEM)),
                       ('key.pem', key.private_bytes(
                           serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption()))):
      with open(os.path.join(dns_only, name), 'wb') as f:
        f.write(data)
    a2 = tt.Tunnel(tt.Plan('host-a', [7002], {}),
                   tt.host_credentials(work, user, 'host-a', 'run1', tempfile.mkdtemp(dir=work)))
    by_name = ctx(os.path.join(dns_only, 'cert.pem'), os.path.join(dns_only, 'key.pem'))
    result['user leaf naming host-b from 127.0.0.9'] = attempt(a2, 7002, by_name, '127.0.0.9')
    result['user leaf naming host-b from 127.0.0.3'] = attempt(a2, 7002, by_name, '127.0.0.3')
    backend.kill(); backend.wait(); a.close(); b.close(); a2.close()
    print('RESULT ' + json.dumps(result))
''')


@pytest.mark.timeout(180)
def test_with_names_in_the_spec_a_copied_leaf_is_refused_at_the_endpoint(tmp_path):
  why = skip_reason()
  if why is not None:
    pytest.skip(f'namespaces: {why}')
  script, names, work = tmp_path / 'named.py', tmp_path / 'hosts', tmp_path / 'work'
  script.write_text(_NAMED)
  names.write_text('127.0.0.1 localhost\n127.0.0.2 host-a\n127.0.0.3 host-b\n')
  work.mkdir()
  proc = subprocess.run(
      ['unshare', '-rnm', 'sh', '-c',
       'mount --bind "$1" /etc/hosts && ip link set lo up && shift && exec "$@"', 'sh',
       str(names), sys.executable, str(script), str(work)],
      capture_output=True, text=True, timeout=150, env=dict(os.environ, PYTHONPATH=REPO),
      cwd=REPO)
  lines = [x for x in proc.stdout.splitlines() if x.startswith('RESULT ')]
  assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
  result = json.loads(lines[-1][len('RESULT '):])
  assert result.pop('through') == 'HELLO'  # the tunnel works with names in the spec
  assert result == {
      'run leaf of host-b from 127.0.0.9': {'refused': 1, 'accepted': 0},
      'run leaf of host-b from 127.0.0.3': {'refused': 0, 'accepted': 1},
      'user leaf naming host-b from 127.0.0.9': {'refused': 1, 'accepted': 0},
      'user leaf naming host-b from 127.0.0.3': {'refused': 0, 'accepted': 1},
  }, proc.stderr[-3000:]
