"""The loopback fallback (issue 64): `loopback_bind.c` preloaded, and `isolation`'s checks.

A host without user namespaces is made as docs/notes say, without touching the machine:
inside `unshare -rn`, an extra non-loopback address (10.64.0.1 on a veth pair) so a
wildcard bind shows on it, then `max_user_namespaces=0` and every capability dropped
(`setpriv`), so no nested namespace can be made, as on Ubuntu 24.04 or in a container.
There a real `reverb.Server` and `courier.Server` run with and without the preload: with
it they listen on loopback only (read from the kernel), clients on localhost:port work
and the non-loopback address refuses; without it the same servers listen on the
wildcard, which is what makes these assertions able to fail.

The accept filter (another uid refused) needs a second uid: as root (the sandbox), a
client is started as root and drops to uid 65534 (setresuid) once its imports are done,
since that uid cannot read the interpreter's files here; elsewhere those tests skip,
naming why. Each runs the same server without the preload too, where the other uid is
served. Own-uid and Unix connections, and a peer gone before the lookup, need no root.
"""

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from seedacme.runtime import isolation

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


@pytest.mark.needs_namespaces  # builds the test host in one
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


@pytest.mark.needs_namespaces  # builds the test host in one
@pytest.mark.timeout(200)
def test_reverb_and_courier_listen_on_loopback_only_with_the_preload(library, tmp_path):
  got, _ = _in_no_namespace_host(_DRIVER, [library, ADDRESS, _SERVERS], tmp_path,
                                 timeout=180)

  # The host offers no namespace: the loopback mechanism, with the reason why.
  mechanism, reason = got['choice']
  assert mechanism == 'loopback', got['choice']
  assert reason.startswith('namespace: no private network namespace'), reason
  assert 'refuses connections from other uids at accept' in reason
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


@pytest.mark.needs_namespaces  # builds the test host in one
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


# ---------------------------------------------------------------------------------------
# The accept filter: only the run's own uid is served.

STRANGER = 65534

# Drops to uid argv[N] (started as root) after the imports above it are done.
_DROP = r"""
def drop(uid):
  if uid != os.geteuid():
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
"""


# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own
# SETTINGS frame (type 4) first.
_GRPC_CLIENT = _DROP + r"""
import json, os, socket, sys
import courier, reverb
drop(int(sys.argv[1]))
servers = json.loads(sys.stdin.readline())  # {'preload': {'reverb': port, ...}, ...}
PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])

def raw(port):
  got, end, c = b'', 'open', None
  try:
    c = socket.create_connection(('127.0.0.1', port), timeout=10)
    c.sendall(PREFACE)
    while len(got) < 9:
      more = c.recv(64)
      if not more:
        end = 'closed'
        break
      got += more
  except OSError as e:
    end = type(e).__name__
  if c is not None:
    c.close()
  return {'frame_type': got[3] if len(got) >= 4 else None, 'end': end}

out = {'uid': os.geteuid()}
for name, ports in servers.items():
  got = {'reverb_raw': raw(ports['reverb']), 'courier_raw': raw(ports['courier'])}
  try:
    got['courier_ping'] = courier.Client(f'localhost:{ports["courier"]}',
                                         call_timeout=3).ping()
  except Exception:  # pylint: disable=broad-except
    got['courier_ping'] = 'error'
  try:
    got['reverb_info'] = sorted(reverb.Client(f'localhost:{ports["reverb"]}')
                                .server_info(timeout=3))
  except Exception:  # pylint: disable=broad-except
    got['reverb_info'] = 'error'
  out[name] = got
print(json.dumps(out), flush=True)
"""

# Both servers (preloaded and not) and both clients start at once (their imports are the
# slow part); the stranger's client goes first, then ours: the preloaded servers still
# serve after refusing.
_GRPC_DRIVER = r"""
import json, os, subprocess, sys
from seedacme.runtime import isolation
library, servers, client, stranger = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
pipes = dict(text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
started = {name: subprocess.Popen([sys.executable, '-c', servers], **pipes, env=env,
                                  stderr=open(f'{name}.err', 'w'))
           for name, env in (('preload', isolation.loopback_env(os.environ, library)),
                             ('plain', dict(os.environ)))}
clients = {uid: subprocess.Popen([sys.executable, '-c', client, uid], **pipes,
                                 stderr=open(f'client-{uid}.err', 'w'))
           for uid in (stranger, str(os.geteuid()))}
try:
  ready = {}
  for name, p in started.items():
    line = p.stdout.readline()
    if not line:
      sys.exit(f'the {name} servers did not start: ' + open(f'{name}.err').read()[-2000:])
    ready[name] = json.loads(line)
  ports = json.dumps({name: {'reverb': r['reverb'], 'courier': r['courier']}
                      for name, r in ready.items()})
  out = {'ready': ready}
  for uid, p in clients.items():  # one after the other
    said = p.communicate(ports + '\n', timeout=120)[0]
    if not said:
      sys.exit(f'the client as uid {uid} ended with {p.returncode}, saying nothing: '
               + open(f'client-{uid}.err').read()[-2000:])
    out[uid] = json.loads(said)
finally:
  for p in [*started.values(), *clients.values()]:
    if p.stdin and not p.stdin.closed:
      p.stdin.close()
  for p in [*started.values(), *clients.values()]:
    p.wait(60)
out['preload_stderr'] = [line for line in open('preload.err') if 'loopback_bind' in line]
print(json.dumps(out))
"""


@pytest.mark.needs_namespaces  # unshare -n
@pytest.mark.needs_other_uid
@pytest.mark.timeout(300)
def test_courier_and_reverb_serve_only_their_own_uid_with_the_preload(library, tmp_path):
  # In a network namespace of its own (root: no user namespace, so uids are the host's).
  done = subprocess.run(
      ['unshare', '-n', 'sh', '-c', 'ip link set lo up && exec "$@"', 'sh', sys.executable,
       '-c', _GRPC_DRIVER, library, _SERVERS, _GRPC_CLIENT, str(STRANGER)],
      capture_output=True, text=True, timeout=280, cwd=str(tmp_path),
      env=_python_env(tmp_path), stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(done.stdout.strip().splitlines()[-1])
  assert got['ready']['preload']['active'] and not got['ready']['plain']['active']
  ours, stranger = got[str(os.geteuid())], got[str(STRANGER)]
  assert stranger['uid'] == STRANGER and ours['uid'] == os.geteuid() != STRANGER

  # Preloaded: the other uid's connections are reset before a byte of HTTP/2 is served
  # (no SETTINGS frame), and its real clients fail; ours, made afterwards, are served.
  refused = stranger['preload']
  for server in ('reverb_raw', 'courier_raw'):  # reset while sending or reading
    assert refused[server]['frame_type'] is None, refused
    assert refused[server]['end'] in ('ConnectionResetError', 'BrokenPipeError'), refused
  assert refused['courier_ping'] == 'error' and refused['reverb_info'] == 'error'
  served = {'reverb_raw': {'frame_type': 4, 'end': 'open'},
            'courier_raw': {'frame_type': 4, 'end': 'open'},
            'courier_ping': 'pong', 'reverb_info': ['q']}
  assert ours['preload'] == served
  # Said on stderr (rate-bounded), naming the uid, for both servers' ports.
  lines = got['preload_stderr']
  assert lines and all(f'owner uid {STRANGER}' in line for line in lines), lines
  assert all(f'accept only uid {os.geteuid()}' in line for line in lines), lines
  said_ports = {int(line.split(' to port ')[1].split()[0]) for line in lines}
  ready = got['ready']['preload']
  assert said_ports <= {ready['reverb'], ready['courier']} and said_ports, lines

  # The same servers without the preload serve the other uid: the filter is what refused.
  assert stranger['plain'] == served and ours['plain'] == served


# A preloaded (or plain) Python server at uid argv[1]: each stdin line, 'blocking' or
# 'nonblocking', is one accept(); it answers the peer's port (None: EAGAIN) and the
# interposer's refusal count so far.
_ACCEPTOR = _DROP + r"""
import json, os, socket, sys
from seedacme.runtime import isolation
drop(int(sys.argv[1]))
s = socket.socket(socket.AF_INET6)
s.bind(('::', 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
for line in sys.stdin:
  s.setblocking(line.strip() == 'blocking')
  try:
    c, peer = s.accept()
    c.sendall(b'served')
    c.close()
    got = peer[1]
  except BlockingIOError:
    got = None
  print(json.dumps({'peer': got, 'refused': isolation.refused_connections()}), flush=True)
"""

# Connects as uid argv[2] to port argv[1] once per character of argv[3] ('4': an IPv4
# socket to 127.0.0.1, '6': an IPv6 one to ::ffff:127.0.0.1), prints the local ports once
# all are connected, then what each connection brought within argv[4] seconds.
_CONNECTOR = _DROP + r"""
import json, os, socket, sys
port, uid, families, wait = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
drop(uid)
conns = []
for f in families:
  c = socket.socket(socket.AF_INET if f == '4' else socket.AF_INET6)
  c.connect(('127.0.0.1' if f == '4' else '::ffff:127.0.0.1', port))
  conns.append(c)
print(json.dumps([c.getsockname()[1] for c in conns]), flush=True)
ends = []
for c in conns:
  c.settimeout(wait)
  try:
    ends.append({b'served': 'served', b'': 'closed'}.get(c.recv(16), 'other'))
  except ConnectionResetError:
    ends.append('reset')
  except socket.timeout:
    ends.append('waiting')
print(json.dumps(ends), flush=True)
"""


class _Acceptor:
  """The acceptor child and clients of given uids connecting to it."""

  def __init__(self, env, uid, tmp_path):
    self.err = open(tmp_path / f'acceptor-{uid}.err', 'w+')
    self.proc = subprocess.Popen([sys.executable, '-S', '-c', _ACCEPTOR, str(uid)],
                                 env=env, text=True, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.err)
    self.port = int(self.proc.stdout.readline())
    self.env = _python_env(tmp_path)
    self.clients = []

  def connect(self, uid, families, wait=10):
    """Starts a client; returns once all its connections are in the listen queue."""
    client = subprocess.Popen([sys.executable, '-S', '-c', _CONNECTOR, str(self.port),
                               str(uid), families, str(wait)], env=self.env, text=True,
                              stdout=subprocess.PIPE)
    self.clients.append(client)
    return client, json.loads(client.stdout.readline())

  def accept(self, mode):
    self.proc.stdin.write(mode + '\n')
    self.proc.stdin.flush()
    return json.loads(self.proc.stdout.readline())

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(10)
    for client in self.clients:
      client.kill()
      client.wait(10)
    self.err.seek(0)
    return [line for line in self.err.read().splitlines() if 'loopback_bind' in line]


def _ends(client):
  return json.loads(client.communicate(timeout=30)[0])


@pytest.mark.needs_other_uid
@pytest.mark.timeout(120)
@pytest.mark.parametrize('server_uid', [0, STRANGER], ids=['root-server', 'nobody-server'])
def test_plain_accept_keeps_only_the_servers_own_uid(library, tmp_path, server_uid):
  other = STRANGER if server_uid == 0 else 0  # root is refused too: uid, not privilege
  acceptor = _Acceptor(isolation.loopback_env(_python_env(tmp_path), library), server_uid,
                       tmp_path)
  try:
    # Blocking: the other uid's two connections (IPv4 in tcp, IPv6 in tcp6) come first
    # in the queue; accept() skips them and returns ours.
    stranger, _ = acceptor.connect(other, '46')
    ours, (our_port,) = acceptor.connect(server_uid, '6')
    assert acceptor.accept('blocking') == {'peer': our_port, 'refused': 2}
    assert _ends(stranger) == ['reset', 'reset'] and _ends(ours) == ['served']

    # Non-blocking with ours queued behind a refused one: returned, not EAGAIN (under an
    # edge-triggered epoll, as gRPC's, it would otherwise wait for the next connection).
    stranger, _ = acceptor.connect(other, '4')
    ours, (our_port,) = acceptor.connect(server_uid, '4')
    assert acceptor.accept('nonblocking') == {'peer': our_port, 'refused': 3}
    assert _ends(stranger) == ['reset'] and _ends(ours) == ['served']

    # Non-blocking with only a refused one pending: as if nothing were (EAGAIN).
    stranger, _ = acceptor.connect(other, '6')
    assert acceptor.accept('nonblocking') == {'peer': None, 'refused': 4}
    assert _ends(stranger) == ['reset']

    # A burst a second later: one line on stderr for it, however many were refused.
    time.sleep(1.1)
    stranger, _ = acceptor.connect(other, '4' * 20)
    assert acceptor.accept('nonblocking') == {'peer': None, 'refused': 24}
    assert _ends(stranger) == ['reset'] * 20
  finally:
    lines = acceptor.close()
  counts = [int(line.split('; ')[-1].split()[0]) for line in lines]
  assert counts[0] == 1 and 5 in counts and not set(counts) & set(range(6, 25)), lines
  assert counts == sorted(counts), lines
  assert all(f'owner uid {other}' in line and f'accept only uid {server_uid}' in line
             for line in lines), lines

  # The same server without the preload: the other uid is first in the queue and served.
  acceptor = _Acceptor(_python_env(tmp_path), server_uid, tmp_path)
  try:
    stranger, (stranger_port,) = acceptor.connect(other, '4')
    ours, _ = acceptor.connect(server_uid, '6', wait=1)
    assert acceptor.accept('blocking') == {'peer': stranger_port, 'refused': None}
    assert _ends(stranger) == ['served'] and _ends(ours) == ['waiting']
  finally:
    assert acceptor.close() == []


# Runs anywhere (no second uid): own-uid TCP and Unix connections are accepted, a peer
# gone before accept() is refused; counted with the preload, all returned without.
_OWN = r"""
import json, os, socket, sys
from seedacme.runtime import isolation
out = {}
tcp = socket.socket(socket.AF_INET6)
tcp.bind(('::', 0))
tcp.listen()
port = tcp.getsockname()[1]
for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::ffff:127.0.0.1')):
  c = socket.socket(family)
  c.connect((host, port))
  name = 'own4' if family == socket.AF_INET else 'own6'
  out[name] = tcp.accept()[1][1] == c.getsockname()[1]
gone = socket.create_connection(('127.0.0.1', port))
gone.close()  # FIN: its socket leaves ESTABLISHED before we look
tcp.setblocking(False)
try:
  tcp.accept()
  out['gone'] = 'accepted'
except BlockingIOError:
  out['gone'] = 'EAGAIN'
unix = socket.socket(socket.AF_UNIX)
unix.bind(sys.argv[1])
unix.listen()
u = socket.socket(socket.AF_UNIX)
u.connect(sys.argv[1])
out['unix'] = unix.accept()[0].family == socket.AF_UNIX
out['refused'] = isolation.refused_connections()
print(json.dumps(out))
"""


@pytest.mark.timeout(60)
def test_own_uid_and_unix_connections_pass_and_a_peer_gone_is_refused(library, tmp_path):
  got = {}
  for name, env in (('preload', isolation.loopback_env(_python_env(tmp_path), library)),
                    ('plain', _python_env(tmp_path))):
    done = subprocess.run([sys.executable, '-S', '-c', _OWN, str(tmp_path / f'{name}.sock')],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    got[name] = (json.loads(done.stdout), done.stderr)
  (preload, stderr), (plain, _) = got['preload'], got['plain']
  assert preload == {'own4': True, 'own6': True, 'gone': 'EAGAIN', 'unix': True,
                     'refused': 1}, (preload, stderr)
  assert 'not in /proc/self/net/tcp{,6}: closed?' in stderr, stderr
  assert stderr.count('loopback_bind') == 1, stderr
  assert plain == {'own4': True, 'own6': True, 'gone': 'accepted', 'unix': True,
                   'refused': None}


def test_wildcard_binds_go_to_the_loopback_address_named(library, tmp_path):
  """SEEDACME_LOOPBACK_ADDRESS: the Vertex emulation's containers each get a loopback
  of their own (launchers/vertex.py); not a 127/8 address: ignored, 127.0.0.1."""
  code = ('import json, socket\n'
          'v4 = socket.socket(); v4.bind(("0.0.0.0", 0))\n'
          'v6 = socket.socket(socket.AF_INET6); v6.bind(("::", 0))\n'
          'print(json.dumps([v4.getsockname()[0], v6.getsockname()[0]]))\n')
  seen = {}
  for address in ('127.0.2.7', '10.1.2.3'):
    env = {**isolation.loopback_env(_python_env(tmp_path), library),
           isolation.ADDRESS_ENV: address}
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    seen[address] = json.loads(done.stdout.strip().splitlines()[-1])
  assert seen['127.0.2.7'] == ['127.0.2.7', '::ffff:127.0.2.7'], seen
  assert seen['10.1.2.3'] == ['127.0.0.1', '::ffff:127.0.0.1'], seen
