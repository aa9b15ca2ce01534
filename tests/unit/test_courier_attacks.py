"""The three reported attacks on the Courier guard, as regression tests (issue 47).

1. A non-module `sys.modules` entry (`typing.io`, `typing.re`: classes in Python 3.10)
   was handed to Courier unchecked, so a caller read any attribute of it: `__class__`
   is `type`, a class made on the node (and with `copyreg._reconstructor`, `exec`).
2. `complex('not-a-number')` with state: Courier calls the allowed name, does not check
   the result, and a constructor that raises was a SIGSEGV of the whole process.
3. numpy's `_reconstruct` with a `dtype` whose state forges flags (`hasobject` on a
   void type): an array whose bytes the guard's own walk read as object pointers.

Each is sent by a second process to a central node's surface (`make_central_server`
over a node stand-in that records what reaches it: the guard under test is the
server's, not the node's) and, for the first, answered by a hostile server to a client
with the guard installed (sync and futures). On the code before the guard was made
total (ce34d39, run against it from a worktree) the first reaches the node as a class
(the node saw `type`), the second ends the server (SIGSEGV, -11), the third is rebuilt
up to numpy's own error (the caller gets Courier's anonymous "ToUtilStatus failure.",
no refusal); now each is a `RefusedPayloadError` naming it and the node serves on.

Last, the two replies that ended a client on Courier's asynchronous path with or
without the guard (SIGABRT): now `seedacme.wire.courier_futures` makes it the
synchronous call, which raises.
"""

import subprocess
import sys

import courier
import portpicker
import pytest

from tests.unit import courier_fuzzing as fuzz

REPO = fuzz.REPO

_SERVER = '''
import sys, time
sys.path.insert(0, sys.argv[1])
from seedacme.nodes.service import make_central_server
class Node:
  """Records the type of what reaches it."""
  seen = []
  def step(self, request):
    Node.seen.append(type(request).__name__)
    return {'seen': list(Node.seen)}
  def report_acting(self, report):
    Node.seen.append(type(report).__name__)
  def get_variables(self, names):
    return []
  def shm_offer(self, *args):
    return None
server = make_central_server(Node(), port=int(sys.argv[2]))
server.Start()
while True:
  time.sleep(60)
'''

# Sent from a process of its own: `Reduced` spoofs `sys.modules` on the sending side.
_SEND = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import courier, numpy as np
from tests.unit.courier_fuzzing import Reduced
client = courier.Client(sys.argv[2], call_timeout=10)
attacks = {
    'typing.io': Reduced('typing.io', '__class__', ('X', (), {})),
    'typing.re': Reduced('typing.re', '__class__', ('Y', (), {})),
    'complex': Reduced('builtins', 'complex', ('not-a-number',), {'x': 1}),
    'forged dtype': Reduced('numpy.core.multiarray', '_reconstruct', (
        np.ndarray, (0,), b'b'), (1, (1,), Reduced(
            'numpy', 'dtype', ('V8', False, True), (3, '|', None, None, None, 8, 1, 0x3f)),
        False, b'AAAAAAAA')),
}
try:
  print(json.dumps({'reply': client.step(attacks[sys.argv[3]])}))
except Exception as e:
  print(json.dumps({'error': str(e)[:2000]}))
'''


@pytest.fixture(name='server')
def fixture_server(tmp_path):
  port = portpicker.pick_unused_port()
  log = open(tmp_path / 'server.log', 'w')
  proc = subprocess.Popen([sys.executable, '-c', _SERVER, REPO, str(port)], stdout=log,
                          stderr=subprocess.STDOUT, cwd=REPO)
  fuzz._wait_serving(f'localhost:{port}', proc)
  yield proc, f'localhost:{port}'
  proc.kill()
  proc.wait()
  log.close()


def _send(address, attack):
  result = subprocess.run([sys.executable, '-c', _SEND, REPO, address, attack],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout.strip().splitlines()[-1]


def _assert_refused_and_serving(server, attack, named):
  proc, address = server
  out = _send(address, attack)
  assert proc.poll() is None, f'{attack} ended the server ({proc.returncode})'
  assert 'RefusedPayloadError' in out and named in out, out
  assert courier.Client(address, call_timeout=10).ping() is True
  assert courier.Client(address, call_timeout=10).step({'k': 1}) == {'seen': ['dict']}


@pytest.mark.timeout(120)
@pytest.mark.parametrize('attack', ['typing.io', 'typing.re'])
def test_non_module_sys_modules_entry_is_gated(server, attack):
  """Old code: the node's step got a class built by `type` ({'seen': ['type']})."""
  _assert_refused_and_serving(server, attack, f'{attack}.__class__')


@pytest.mark.timeout(120)
def test_allowed_constructor_given_bad_arguments_does_not_end_the_server(server):
  """Old code: SIGSEGV (returncode -11) while Courier rebuilt the argument."""
  _assert_refused_and_serving(server, 'complex', 'builtins.complex')


@pytest.mark.timeout(120)
def test_forged_dtype_flags_build_no_array(server):
  """Old code: rebuilt up to numpy's error; the caller got "ToUtilStatus failure."."""
  _assert_refused_and_serving(server, 'forged dtype', 'numpy.core.multiarray._reconstruct')


_HOSTILE = '''
import sys, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit.courier_fuzzing import Reduced
server = courier.Server(port=int(sys.argv[2]))
server.Bind('step', lambda *a: Reduced('typing.io', '__class__', ('X', (), {})))
server.Bind('echo', lambda x: x)
server.Start()
while True:
  time.sleep(60)
'''


@pytest.mark.timeout(120)
def test_reply_naming_a_non_module_entry_is_refused_on_the_client(tmp_path):
  """A hostile server answers a guarded client with `typing.io.__class__(...)`: old
  code handed the client a class (no error); now `accept` refuses it, sync and futures."""
  from seedacme.wire import courier_guard  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen([sys.executable, '-c', _HOSTILE, REPO, str(port)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    fuzz._wait_serving(f'localhost:{port}', proc, 'echo')
    courier_guard.install()
    client = courier.Client(f'localhost:{port}', call_timeout=10)
    for reply in (client.step(), client.futures.step().result(timeout=10)):
      assert not isinstance(reply, type)
      with pytest.raises(courier_guard.RefusedPayloadError, match='typing.io.__class__'):
        courier_guard.check(reply, 'the reply')
  finally:
    proc.kill()
    proc.wait()


_ABORTING = '''
import sys, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit.courier_fuzzing import Reduced
deep = 1
for _ in range(60):
  deep = [deep]
server = courier.Server(port=int(sys.argv[2]))
server.Bind('pairs', lambda: Reduced('builtins', 'set', (), None, None, [1]))
server.Bind('deep', lambda: deep)
server.Bind('echo', lambda x: x)
server.Start()
while True:
  time.sleep(60)
'''

_FUTURES_CLIENT = '''
import sys
sys.path.insert(0, sys.argv[1])
import courier
from seedacme.wire import courier_guard
courier_guard.install()
client = courier.Client(sys.argv[2], call_timeout=10)
try:
  client.futures.__getattr__(sys.argv[3])().result(timeout=10)
except Exception as e:
  print(type(e).__name__)
assert client.futures.echo(5).result(timeout=10) == 5
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize('reply', ['pairs', 'deep'])
def test_futures_reply_that_fails_to_rebuild_does_not_end_the_client(reply):
  """Old code: SIGABRT (-6) of the client on Courier's async path, guard or not: key/value
  pairs that are not pairs (pybind11's error in the callback), a reply nested 60 deep
  (`client.cc:111 Check failed: ok`). Now the call raises and the client goes on."""
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen([sys.executable, '-c', _ABORTING, REPO, str(port)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    fuzz._wait_serving(f'localhost:{port}', proc, 'echo')
    client = subprocess.run([sys.executable, '-c', _FUTURES_CLIENT, REPO,
                             f'localhost:{port}', reply], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert client.returncode == 0, (client.returncode, client.stderr[-1500:])
    assert client.stdout.strip() == 'StatusNotOk'
  finally:
    proc.kill()
    proc.wait()
