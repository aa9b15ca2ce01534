"""`run_local` on a host where no network namespace can be made (issue 64).

Such a host is made without touching this machine (`scripts/without_namespaces`: nested
user namespaces forbidden, every capability dropped; on a host that already lacks them
the test runs there directly). With no flag, `run_local` must say it uses the loopback
mechanism, train Catch, and keep every server of the run on loopback: what its
processes listen on is read from the kernel (`/proc/<pid>/net/tcp{,6}`), a connection
to each port at this host's own network address is refused, and a connection of
another uid over loopback gets no byte of gRPC back (where this process can act as
another uid: not inside `scripts/without_namespaces`, whose namespace maps only root).
"""

import os
import socket
import subprocess

import pytest

from seedacme.runtime import isolation
from tests.integration.launch import WITHOUT_NAMESPACES, Run, leftover_processes, target_value, wait_for

pytestmark = pytest.mark.integration


def _prefix():
  """How to get a host without namespaces here: this host itself, or the wrapper."""
  if isolation.namespace_problem():
    return []
  probe = subprocess.run([*WITHOUT_NAMESPACES, 'true'], capture_output=True, text=True)
  if probe.returncode != 0:
    if os.environ.get('SEEDACME_REQUIRE_NAMESPACES'):
      pytest.fail(f'scripts/without_namespaces failed: {probe.stderr}')
    pytest.skip(f'cannot make a host without namespaces here: {probe.stderr.strip()}')
  return WITHOUT_NAMESPACES


def _host_addresses():
  """This host's non-loopback IPv4 addresses (what another machine would dial)."""
  out = subprocess.run(['ip', '-o', '-4', 'addr', 'show', 'scope', 'global'],
                       capture_output=True, text=True).stdout
  return [line.split()[3].split('/')[0] for line in out.splitlines()]


# A plain-socket client (system Python: uid 65534 may not read the venv's) that sends
# HTTP/2's preface and reports whether any byte came back (a gRPC server answers with
# its SETTINGS frame).
_OTHER_UID_CLIENT = r'''
import socket, sys
try:
  s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)
  s.sendall(b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes.fromhex('000000040000000000'))
  data = s.recv(100)
except OSError as e:
  data = b''
print('served' if data else 'refused')
'''


@pytest.mark.timeout(300)
def test_run_local_trains_catch_on_loopback_where_no_namespace_can_be_made(
    tmp_path, other_uid_problem):
  prefix = _prefix()
  with Run(['catch', 'vtrace', '2', '16', '--max_seconds', '150', '--target_return', '0.9',
            '--progress_interval_s', '3'], str(tmp_path), prefix=prefix) as run:
    assert wait_for(lambda: run.progress(), 120, run), run.output[-3000:]
    pids = leftover_processes(run.tag)
    listeners = isolation.listening_sockets(pids)
    tcp = sorted({s.port for s in listeners if s.proto == 'tcp'})
    assert len(tcp) >= 2, listeners  # Courier (learner) and Reverb at least
    assert not isolation.non_loopback_listeners(pids), listeners
    for address in _host_addresses():
      for port in tcp:
        with socket.socket() as s:
          s.settimeout(2)
          assert s.connect_ex((address, port)) != 0, f'{address}:{port} reachable'
    if other_uid_problem is None:  # root here can become another uid (not in a container)
      for port in tcp:
        got = subprocess.run(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups',
                              '/usr/bin/python3', '-c', _OTHER_UID_CLIENT, str(port)],
                             capture_output=True, text=True, timeout=30)
        assert got.stdout.strip() == 'refused', (port, got.stdout, got.stderr)
    run.complete(240)
  out = run.output
  assert 'seedacme: isolation: loopback (namespace: ' in out, out[:2000]
  assert 'refuses connections from other uids' in out
  assert target_value(run.json('summary.json')) >= 0.9
