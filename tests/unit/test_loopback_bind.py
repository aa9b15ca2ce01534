"""The loopback fallback (issue 64): `loopback_bind.c` preloaded, and `isolation`'s checks.

A host without user namespaces is made as docs/notes say, without touching the machine:
inside `unshare -rn`, an extra non-loopback address (10.64.0.1 on a veth pair) so a
wildcard bind shows on it, then `max_user_namespaces=0` and every capability dropped
(`setpriv`), so no nested namespace can be made, as on Ubuntu 24.04 or in a container.
There a real `reverb.Server` and `courier.Server` run with and without the preload: with
it they listen on loopback only (read from the kernel), clients on localhost:port work
and the non-loopback address refuses; without it the same servers listen on the
wildcard, which is what makes these assertions able to fail.
"""

import functools
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from seedacme.runtime import isolation
from tests import emulated_hosts

ADDRESS = '10.64.0.1'  # only inside the test's own namespace
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(isolation.__file__))))

# Builds the host: own netns with lo and one veth address, then no namespaces, no caps.
_NO_NAMESPACES = (
    'ip link set lo up && ip link add sa0 type veth peer name sa1 && '
    f'ip addr add {ADDRESS}/24 dev sa0 && ip link set sa0 up && ip link set sa1 up && '
    'echo 0 > /proc/sys/user/max_user_namespaces && '
    'exec setpriv --bounding-set=-all --inh-caps=-all "$@"')


@functools.cache
def _namespace_problem():
  """Why this host cannot build the test host (it needs a namespace to start in)."""
  return isolation.namespace_problem() or (
      None if shutil.which('setpriv') else 'setpriv (util-linux) is not installed')


@pytest.fixture
def needs_namespaces():
  """Skips the test where the host has no namespaces, naming why; fails instead where
  the run requires them (SEEDACME_REQUIRE_NAMESPACES=1, as CI sets)."""
  why = _namespace_problem()
  if why and emulated_hosts.namespaces_required():
    pytest.fail(f'{emulated_hosts.REQUIRE_VAR}=1 but: {why}')
  if why:
    pytest.skip(f'this host has no namespaces to build the test host in: {why}')


@pytest.fixture(scope='module')
def library(tmp_path_factory):
  """The checkout's loopback_bind.c, built now (what scripts/setup builds)."""
  if isolation.compiler() is None:
    pytest.skip('no C compiler to build loopback_bind.c')
  return isolation.build_library(str(tmp_path_factory.mktemp('lib') / isolation.LIBRARY_NAME))


def _python_env(tmp_dir):
  return {**os.environ, 'PYTHONPATH': REPO, 'TMPDIR': str(tmp_dir)}


def _in_no_namespace_host(code, args, tmp_dir, env=None, timeout=150):
  """Runs `python -c code *args` in the namespace-less host (with `env`, default the
  test's); its stdout's last line, decoded as JSON, and its stderr."""
  done = subprocess.run(['unshare', '-rn', 'sh', '-c', _NO_NAMESPACES, 'sh',
                         sys.executable, '-c', code, *args],
                        capture_output=True, text=True, timeout=timeout, cwd=str(tmp_dir),
                        env=env or _python_env(tmp_dir), stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


# What the Python socket calls give (run with or without the preload); each listener then
# dialled on the non-loopback address, argv[1].
_SOCKETS = r'''
import errno, json, os, socket, sys
from seedacme.runtime import isolation
address = sys.argv[1]
cases = [('tcp4 ""', socket.AF_INET, socket.SOCK_STREAM, ('', 0), None),
         ('tcp6 ::', socket.AF_INET6, socket.SOCK_STREAM, ('::', 0), None),
         ('tcp6 :: v6only', socket.AF_INET6, socket.SOCK_STREAM, ('::', 0), 1),
         ('tcp4 unbound listen', socket.AF_INET, socket.SOCK_STREAM, None, None),
         ('tcp6 unbound listen', socket.AF_INET6, socket.SOCK_STREAM, None, None),
         ('tcp4 0.0.0.0', socket.AF_INET, socket.SOCK_STREAM, ('0.0.0.0', 0), None),
         ('tcp4 127.0.0.2', socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.2', 0), None),
         ('tcp6 ::1', socket.AF_INET6, socket.SOCK_STREAM, ('::1', 0), None),
         ('tcp4 explicit', socket.AF_INET, socket.SOCK_STREAM, (address, 0), None),
         ('tcp6 explicit mapped', socket.AF_INET6, socket.SOCK_STREAM,
          ('::ffff:' + address, 0), None),
         ('udp4 ""', socket.AF_INET, socket.SOCK_DGRAM, ('', 0), None)]
out, keep = {}, []
for name, family, kind, where, v6only in cases:
  s = socket.socket(family, kind)
  keep.append(s)
  if v6only is not None:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
  try:
    if where is not None:
      s.bind(where)
    if kind == socket.SOCK_STREAM:
      s.listen()
  except OSError as e:
    out[name] = {'error': errno.errorcode[e.errno]}
    continue
  host, port = s.getsockname()[:2]
  reach = 'no'
  if kind == socket.SOCK_STREAM:
    c = socket.socket()
    c.settimeout(5)
    reach = 'refused' if c.connect_ex((address, port)) else 'accepted'
  out[name] = {'address': host, 'port': port, 'from_address': reach}
seen = isolation.listening_sockets([os.getpid()])
print(json.dumps({'sockets': out, 'seen': [list(s) for s in seen],
                  'active': isolation.preload_active()}))
'''


@pytest.mark.usefixtures('needs_namespaces')
@pytest.mark.timeout(90)
def test_python_sockets_are_kept_on_loopback(library, tmp_path):
  got, _ = _in_no_namespace_host(_SOCKETS, [ADDRESS], tmp_path)
  env = isolation.loopback_env(_python_env(tmp_path), library)
  preloaded, stderr = _in_no_namespace_host(_SOCKETS, [ADDRESS], tmp_path, env=env)

  # Without the preload: the wildcard, reachable on the non-loopback address; the
  # explicit binds to it succeed (so the refusals below are the interposer's).
  plain = got['sockets']
  assert not got['active']
  assert plain['tcp4 ""']['address'] == '0.0.0.0'
  assert plain['tcp6 ::']['address'] == '::'
  for name in ('tcp4 ""', 'tcp6 ::'):
    assert plain[name]['from_address'] == 'accepted', name
  assert plain['tcp4 unbound listen']['address'] == '0.0.0.0'
  assert plain['tcp4 explicit']['address'] == ADDRESS
  assert plain['tcp6 explicit mapped']['address'] == '::ffff:' + ADDRESS

  s = preloaded['sockets']
  assert preloaded['active']
  for name in ('tcp4 ""', 'tcp4 unbound listen', 'tcp4 0.0.0.0'):
    assert s[name]['address'] == '127.0.0.1' and s[name]['from_address'] == 'refused', name
  for name in ('tcp6 ::', 'tcp6 unbound listen'):
    assert s[name]['address'] == '::ffff:127.0.0.1' and s[name]['from_address'] == 'refused'
  assert s['tcp6 :: v6only']['address'] == '::1'  # IPv6-only kept: loopback all the same
  assert s['tcp4 127.0.0.2']['address'] == '127.0.0.2'  # explicit loopback: unchanged
  assert s['tcp6 ::1']['address'] == '::1'
  assert s['udp4 ""']['address'] == '127.0.0.1'
  assert s['tcp4 explicit'] == {'error': 'EADDRNOTAVAIL'}
  assert s['tcp6 explicit mapped'] == {'error': 'EADDRNOTAVAIL'}
  assert stderr.count('refused') == 1, stderr  # said once a process

  # The kernel's view (`listening_sockets`) is what getsockname said, loopback only.
  bound = {(v['address'], v['port']) for v in s.values() if 'port' in v}
  assert {(a, p) for _, _, a, p in preloaded['seen']} == bound
  assert all(isolation.is_loopback(a) for _, _, a, _ in preloaded['seen'])
  plain_seen = {(a, p) for _, _, a, p in got['seen']}
  assert ('0.0.0.0', plain['tcp4 ""']['port']) in plain_seen
  assert ('::', plain['tcp6 ::']['port']) in plain_seen
  assert (ADDRESS, plain['tcp4 explicit']['port']) in plain_seen


# A reverb.Server and a courier.Server in a child (preloaded or not), checked from the
# driver by what the kernel says the child listens on and by dialling those ports.
_SERVERS = r'''
import json, sys
import courier, portpicker, reverb
from seedacme.runtime import isolation
rport, cport = portpicker.pick_unused_port(), portpicker.pick_unused_port()
replay = reverb.Server([reverb.Table.queue('q', 10)], port=rport)
server = courier.Server(port=cport)
server.Bind('ping', lambda: 'pong')
server.Start()
info = reverb.Client(f'localhost:{rport}').server_info(timeout=20)
pong = courier.Client(f'localhost:{cport}', call_timeout=20).ping()
print(json.dumps({'reverb': rport, 'courier': cport, 'reverb_tables': sorted(info),
                  'courier_ping': pong, 'active': isolation.preload_active()}), flush=True)
sys.stdin.read()
server.Stop()
replay.stop()
'''

_DRIVER = r'''
import json, os, socket, subprocess, sys
from seedacme.runtime import isolation
library, address, servers = sys.argv[1:4]
out = {'choice': list(isolation.choose_isolation(library=library)),
       'namespace_only': list(isolation.choose_isolation(('namespace',), library=library))}
for preload in (True, False):
  env = isolation.loopback_env(os.environ, library) if preload else dict(os.environ)
  child = subprocess.Popen([sys.executable, '-c', servers], env=env, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  try:
    ready = json.loads(child.stdout.readline())
    tree = isolation.process_tree([child.pid])
    seen = isolation.listening_sockets(tree)
    exposed = isolation.non_loopback_listeners(tree)
    reach = {}
    for port in (ready['reverb'], ready['courier']):
      for host in (address, '127.0.0.1'):
        c = socket.socket()
        c.settimeout(5)
        reach[f'{host}:{port}'] = 'refused' if c.connect_ex((host, port)) else 'accepted'
        c.close()
  finally:
    child.stdin.close()
    child.wait(30)
  out['preload' if preload else 'plain'] = {
      'ready': ready, 'seen': [list(s) for s in seen],
      'exposed': [list(s) for s in exposed], 'reach': reach}
print(json.dumps(out))
'''


@pytest.mark.usefixtures('needs_namespaces')
@pytest.mark.timeout(200)
def test_reverb_and_courier_listen_on_loopback_only_with_the_preload(library, tmp_path):
  got, _ = _in_no_namespace_host(_DRIVER, [library, ADDRESS, _SERVERS], tmp_path,
                                 timeout=180)

  # The host offers no namespace: the loopback mechanism, with the reason why.
  mechanism, reason = got['choice']
  assert mechanism == 'loopback', got['choice']
  assert reason.startswith('namespace: no private network namespace'), reason
  assert 'any local user' in reason
  assert got['namespace_only'][0] is None and 'namespace:' in got['namespace_only'][1]

  for run in ('preload', 'plain'):  # both servers answered clients on localhost:port
    ready = got[run]['ready']
    assert ready['reverb_tables'] == ['q'] and ready['courier_ping'] == 'pong', run
  ready = got['preload']['ready']
  ports = {ready['reverb'], ready['courier']}
  assert ready['active']
  tcp = {(a, p) for _, proto, a, p in got['preload']['seen'] if proto == 'tcp'}
  assert ports <= {p for _, p in tcp}, tcp  # seen: the check is not vacuous
  assert all(isolation.is_loopback(a) for _, _, a, _ in got['preload']['seen']), tcp
  assert got['preload']['exposed'] == []
  for port in ports:
    assert got['preload']['reach'] == {**got['preload']['reach'],
                                       f'{ADDRESS}:{port}': 'refused',
                                       f'127.0.0.1:{port}': 'accepted'}

  # Without it the same servers listen on the wildcard, reachable from outside.
  plain = got['plain']
  ports = {plain['ready']['reverb'], plain['ready']['courier']}
  assert not plain['ready']['active']
  assert ports <= {p for _, proto, a, p in plain['exposed'] if a == '::'}, plain['exposed']
  assert all(plain['reach'][f'{ADDRESS}:{p}'] == 'accepted' for p in ports)


@pytest.mark.timeout(60)
def test_choose_isolation_picks_the_strongest_this_host_offers(library):
  choice = isolation.choose_isolation(library=library)
  if _namespace_problem() is None:
    assert choice.mechanism == 'namespace', choice
  else:  # a host without namespaces: the fallback, naming what the namespace lacked
    assert choice.mechanism == 'loopback', choice
    assert choice.reason.startswith('namespace: no private network namespace'), choice
  # Asked for the fallback alone (a side-by-side measurement): it holds here too.
  assert isolation.choose_isolation(('loopback',), library=library).mechanism == 'loopback'
  with pytest.raises(ValueError, match="'netns'"):
    isolation.choose_isolation(('netns',))


@pytest.mark.usefixtures('needs_namespaces')
@pytest.mark.timeout(60)
def test_the_namespace_probe_sees_a_namespace_without_capabilities(tmp_path, monkeypatch):
  # Ubuntu 24.04's default AppArmor policy, imitated with the real tools: `unshare -rn`
  # makes the namespace but nothing in it holds a capability, so `lo` cannot come up.
  # `unshare -rn true` (tls_tunnel's probe before issue 64) succeeds there.
  real = shutil.which('unshare')
  (tmp_path / 'unshare').write_text(
      '#!/bin/sh\n[ "$1" = -rn ] && shift && '
      f'exec {real} -rn setpriv --bounding-set=-all --inh-caps=-all "$@"\n'
      f'exec {real} "$@"\n')
  (tmp_path / 'unshare').chmod(0o755)
  monkeypatch.setenv('PATH', f'{tmp_path}:{os.environ["PATH"]}')
  assert subprocess.run(['unshare', '-rn', 'true'], timeout=30).returncode == 0
  problem = isolation.namespace_problem()
  assert problem is not None and 'Operation not permitted' in problem, problem
  missing = str(tmp_path / 'none.so')
  assert isolation.choose_isolation(library=missing) == (  # neither: both named
      None, f'namespace: {problem}; loopback: {isolation.preload_library(missing).problem}')


@pytest.mark.timeout(60)
def test_a_preloaded_child_listens_on_loopback_on_any_host(library):
  # No namespace needed: the check a launcher makes at start-up, on this very host.
  code = ('import socket, sys\nkeep = []\n'
          'for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):\n'
          '  s = socket.socket(family); s.bind((host, 0)); s.listen(); keep.append(s)\n'
          '  print(s.getsockname()[1], flush=True)\n'
          'sys.stdin.read()\n')
  for env, expect_exposed in ((isolation.loopback_env(None, library), False),
                              (dict(os.environ), True)):
    child = subprocess.Popen([sys.executable, '-S', '-c', code], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
      ports = {int(child.stdout.readline()), int(child.stdout.readline())}
      seen = isolation.listening_sockets([child.pid])
      exposed = isolation.non_loopback_listeners([child.pid])
    finally:
      child.stdin.close()
      child.wait(10)
    assert {s.port for s in seen} == ports and {s.proto for s in seen} == {'tcp'}
    assert {s.port for s in exposed} == (ports if expect_exposed else set()), seen
  assert not isolation.preload_active()  # this process: not preloaded


def test_loopback_env_prepends_and_keeps_what_was_preloaded(library):
  env = isolation.loopback_env({'LD_PRELOAD': '/opt/a.so:/opt/b.so', 'X': '1'}, library)
  assert env['LD_PRELOAD'] == f'{library} /opt/a.so /opt/b.so' and env['X'] == '1'
  assert isolation.loopback_env(env, library)['LD_PRELOAD'] == env['LD_PRELOAD']
  assert isolation.loopback_env({}, library)['LD_PRELOAD'] == library


def test_a_missing_or_stale_library_is_named_and_setup_rebuilds_it(tmp_path, library):
  missing = str(tmp_path / 'none' / isolation.LIBRARY_NAME)
  assert 'is not built' in isolation.preload_library(missing).problem
  choice = isolation.choose_isolation(('loopback',), library=missing)
  assert choice.mechanism is None and choice.reason.startswith('loopback: ')
  with pytest.raises(isolation.IsolationError, match='is not built'):
    isolation.loopback_env({}, missing)

  stale = tmp_path / isolation.LIBRARY_NAME
  stale.write_bytes(open(library, 'rb').read().replace(b'sha256:', b'sha256:0'))
  assert 'built from another version' in isolation.preload_library(str(stale)).problem
  build = [sys.executable, '-m', 'seedacme.runtime.isolation', 'build', str(stale)]
  done = subprocess.run(build, capture_output=True, text=True, timeout=60, cwd=REPO)
  assert done.returncode == 0 and 'built' in done.stdout, done.stderr
  assert isolation.preload_library(str(stale)) == (str(stale), None)
  # Current: nothing to do.
  again = subprocess.run(build, capture_output=True, text=True, timeout=60, cwd=REPO)
  assert again.returncode == 0 and again.stdout == ''

  # No compiler: said, and setup goes on (exit 0), nothing built.
  other = str(tmp_path / 'nocc' / isolation.LIBRARY_NAME)
  done = subprocess.run(build[:-1] + [other], capture_output=True, text=True, timeout=60,
                        cwd=REPO, env={**os.environ, 'PATH': str(tmp_path), 'CC': ''})
  assert done.returncode == 0 and 'no C compiler' in done.stderr, done.stderr
  assert not os.path.exists(other)


def test_setup_built_the_current_library_into_the_venv():
  if isolation.compiler() is None:
    pytest.skip('no C compiler: scripts/setup cannot build it here')
  assert isolation.preload_library() == (isolation.library_path(), None)


def test_listening_sockets_reads_addresses_as_the_kernel_prints_them():
  # This process's own sockets, no preload: IPv4, IPv6 and a UDP socket.
  keep = []
  for family, kind, host in ((socket.AF_INET, socket.SOCK_STREAM, '127.0.0.1'),
                             (socket.AF_INET6, socket.SOCK_STREAM, '::1'),
                             (socket.AF_INET, socket.SOCK_DGRAM, '127.0.0.1')):
    s = socket.socket(family, kind)
    s.bind((host, 0))
    if kind == socket.SOCK_STREAM:
      s.listen()
    keep.append(s)
  connected = socket.create_connection(keep[0].getsockname())  # not listening: not seen
  try:
    seen = set(isolation.listening_sockets([os.getpid()]))
    want = {isolation.Listener(os.getpid(), 'tcp' if s.type == socket.SOCK_STREAM else 'udp',
                               *s.getsockname()[:2]) for s in keep}
    assert want <= seen, seen
    assert connected.getsockname()[1] not in {s.port for s in seen}
  finally:
    connected.close()
    for s in keep:
      s.close()
  assert isolation.is_loopback('::ffff:127.0.0.1') and not isolation.is_loopback('::')
  assert not isolation.is_loopback('::ffff:10.0.0.1') and isolation.is_loopback('127.3.0.1')
