"""Emulated hosts (`tests/emulated_hosts.py`): hosts with their own addresses that reach
each other over a bridge, a link that goes down and comes back, a host whose every
process is killed, and nothing left behind. Traffic goes only to the hosts' own
addresses, inside the namespaces the test made."""

import os
import signal
import sys
import time
import textwrap
import uuid

import pytest

from tests.emulated_hosts import EmulatedHosts, HostError, skip_reason
from tests.integration.launch import TAG_VAR, leftover_processes

_WHY = skip_reason()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f'emulated hosts: {_WHY}')

ECHO_SERVER = textwrap.dedent('''
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7000)); s.listen()
    while True:
      c, _ = s.accept(); c.sendall(c.recv(100)); c.close()
''')
CLIENT = textwrap.dedent('''
    import socket, sys
    try:
      c = socket.create_connection((sys.argv[1], 7000), timeout=2)
      c.sendall(b'hello'); print(c.recv(100).decode())
    except OSError as e:
      print('unreachable', type(e).__name__)
''')


def _ask(hosts, host, address, log):
  """What a client on `host` gets from the echo server at `address`."""
  if os.path.exists(log):
    os.remove(log)
  handle = hosts.run(host, [sys.executable, '-c', CLIENT, address], log=log)
  assert hosts.wait(handle, 30) == 0
  with open(log) as f:
    return f.read().strip()


@pytest.mark.timeout(120)
def test_hosts_talk_over_their_addresses_partitions_and_lost_hosts(tmp_path):
  tag = uuid.uuid4().hex
  env = {TAG_VAR: tag}
  log = str(tmp_path / 'client.txt')
  with EmulatedHosts(['a', 'b', 'c']) as hosts:
    assert hosts.addresses == {'a': '10.77.0.2', 'b': '10.77.0.3', 'c': '10.77.0.4'}
    for host in ('b', 'c'):
      hosts.run(host, [sys.executable, '-c', ECHO_SERVER, hosts.addresses[host]], env=env,
                log=str(tmp_path / f'server_{host}.txt'))
    deadline = 50
    while _ask(hosts, 'a', '10.77.0.3', log) != 'hello' and deadline:
      deadline -= 1  # the server is starting
    assert _ask(hosts, 'a', '10.77.0.3', log) == 'hello'
    assert _ask(hosts, 'a', '10.77.0.4', log) == 'hello'
    # Each host has its own loopback: b's server is not on a's.
    assert _ask(hosts, 'a', '127.0.0.1', log).startswith('unreachable')

    hosts.link('b', up=False)  # a partition
    assert _ask(hosts, 'a', '10.77.0.3', log).startswith('unreachable')
    assert _ask(hosts, 'a', '10.77.0.4', log) == 'hello'  # c is still there
    hosts.link('b', up=True)
    assert _ask(hosts, 'a', '10.77.0.3', log) == 'hello'

    assert hosts.processes('c') == 1
    assert hosts.kill_host('c') >= 1  # a lost host
    assert hosts.processes('c') == 0
    assert _ask(hosts, 'a', '10.77.0.4', log).startswith('unreachable')
    assert hosts.processes('b') == 1
    with pytest.raises(HostError, match="no host 'z'"):
      hosts.run('z', ['true'])
    assert len(leftover_processes(tag)) == 1  # b's server, still running
  assert leftover_processes(tag) == []  # closing the hosts ended every process on them


@pytest.mark.timeout(60)
def test_nothing_is_left_when_the_agent_is_killed(tmp_path):
  tag = uuid.uuid4().hex
  hosts = EmulatedHosts(['a'])
  hosts.run('a', [sys.executable, '-c', 'import time; time.sleep(600)'],
            env={TAG_VAR: tag})
  while not leftover_processes(tag):
    time.sleep(0.05)
  os.kill(hosts.pid1, signal.SIGKILL)  # the agent: PID 1 of the namespaces
  hosts.close()
  for _ in range(50):
    if not leftover_processes(tag):
      break
    time.sleep(0.1)
  assert leftover_processes(tag) == []
