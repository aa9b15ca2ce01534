"""Courier refuses code: a `__reduce__` payload runs nothing on the node it reaches.

The attacks run as a local user would: a second Python process with Courier sends an
object whose `__reduce__` names `os.mkdir` (the payload that created a directory on the
serving node before) to every method of a real central node (V-trace on Catch, a real
Reverb server), and calls the methods that are not its surface; a hostile server on
loopback answers a real env-only actor's and the evaluator's requests with the same
payload. Nothing is created, each caller gets an error naming what was refused, and
the central node goes on serving.
"""

import os
import subprocess
import sys
import textwrap
import threading

import courier
import numpy as np
import portpicker
import pytest
import reverb

from seedacme import envs
from seedacme.actor.env_actor import EnvActor
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.nodes.central import CentralNode
from seedacme.nodes.service import PUBLIC_METHODS, make_central_server
from seedacme.types import Mode
from seedacme.wire import courier_guard
from seedacme.wire.protocol import make_request

_PAYLOAD = '''
import os, sys, courier
class Evil:
  def __init__(self, path): self.path = path
  def __reduce__(self): return (os.mkdir, (self.path,))
'''


def _run_attacker(body: str, timeout: float = 60.0) -> str:
  """`body` in a fresh Python process (Courier imported, `Evil` defined); its stdout."""
  result = subprocess.run([sys.executable, '-c', _PAYLOAD + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


@pytest.fixture(scope='module')
def central(tmp_path_factory):
  """A real central node served the way a program serves it (`make_central_server`)."""
  factory = envs.make_factory('catch')
  spec = envs.env_spec_of(factory(0))
  builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                     hidden_sizes=(16,)))
  replay = reverb.Server(builder.make_replay_tables(spec), port=None)
  config = ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0,
                         logdir=str(tmp_path_factory.mktemp('central')), max_seconds=None,
                         checkpoint_interval_s=None, transport='courier')
  node = CentralNode(builder, spec, config, reverb.Client(f'localhost:{replay.port}'),
                     stop_event=threading.Event())
  port = portpicker.pick_unused_port()
  server = make_central_server(node, port=port, thread_pool_size=4)
  server.Start()
  yield node, factory, f'localhost:{port}'
  server.Stop()
  server.Join()
  node.shutdown()
  replay.stop()


def _valid_step(address: str, factory) -> dict:
  ts = factory(0).reset()
  obs = np.stack([ts.observation] * 2)
  request = make_request(np.arange(2), np.ones(2, np.int64), obs, np.zeros(2),
                         np.ones(2), np.zeros(2))
  reply = courier.Client(address).step(courier_guard.plain(request))
  return courier_guard.accept(reply, 'the reply')


@pytest.mark.timeout(120)
def test_a_reduce_payload_to_any_central_method_runs_nothing_and_names_the_refusal(
    central, tmp_path):
  node, factory, address = central
  target = str(tmp_path / 'pwned')
  out = _run_attacker(f'''
    client = courier.Client({address!r})
    for method in {list(PUBLIC_METHODS)!r}:
      try:
        getattr(client, method)(Evil({target!r}))
        print(method, 'ANSWERED')
      except Exception as e:
        print(method, 'ERROR', str(e).replace(chr(10), ' '))
    # the payload nested where a valid request carries arrays
    try:
      client.step({{'ids': Evil({target!r}), 'transition': [1.0], 'observation': [0]}})
    except Exception as e:
      print('nested', 'ERROR', str(e).replace(chr(10), ' '))
  ''')
  assert not os.path.exists(target), 'the payload ran on the central node'
  lines = out.strip().splitlines()
  assert len(lines) == len(PUBLIC_METHODS) + 1, out
  for line in lines:
    assert ' ERROR ' in line and 'refused to rebuild posix.mkdir' in line, line
  reply = _valid_step(address, factory)  # the node still serves
  assert reply['action'].shape == (2,)


@pytest.mark.timeout(120)
def test_only_the_public_surface_is_served(central):
  node, factory, address = central
  out = _run_attacker(f'''
    client = courier.Client({address!r})
    for method in ('finish', 'shutdown', 'run', 'progress', 'set_courier_server'):
      try:
        getattr(client, method)()
        print(method, 'ANSWERED')
      except Exception as e:
        print(method, 'ERROR', str(e).replace(chr(10), ' ')[:200])
  ''')
  for line in out.strip().splitlines():
    assert ' ERROR ' in line, line
  assert node.stop_reason is None and not node._closing  # pylint: disable=protected-access
  assert _valid_step(address, factory)['action'].shape == (2,)


_HOSTILE_SERVER = '''
port, target = int(sys.argv[1]), sys.argv[2]
server = courier.Server('hostile', port=port)
server.Bind('step', lambda request: {'action': Evil(target)})
server.Bind('shm_offer', lambda *args: Evil(target))
server.Start()
print('ready', flush=True)
sys.stdin.read()  # until the test closes our stdin
server.Stop()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize('mode', [Mode.TRAIN, Mode.EVAL])
def test_a_hostile_server_reply_runs_nothing_on_an_actor(tmp_path, mode):
  """Whoever answers on the central node's port (it restarts; another user binds it)
  sends the payload back: the actor and the evaluator refuse it by name."""
  port = portpicker.pick_unused_port()
  target = str(tmp_path / 'pwned')
  hostile = subprocess.Popen([sys.executable, '-c', _PAYLOAD + _HOSTILE_SERVER, str(port),
                              target], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
  try:
    assert hostile.stdout.readline().strip() == 'ready'
    actor = EnvActor(courier.Client(f'localhost:{port}'), envs.make_factory('catch'),
                     actor_id=0, num_envs=2, first_env_id=0, mode=mode, max_steps=3,
                     transport='auto', stop_event=threading.Event())
    with pytest.raises(courier_guard.RefusedPayloadError, match='posix.mkdir'):
      actor.run()
    assert not os.path.exists(target), 'the payload ran on the actor'
  finally:
    hostile.stdin.close()
    hostile.wait(10)


@pytest.mark.timeout(120)
def test_launchpads_courier_node_path_serves_only_the_surface(central, tmp_path):
  """Unsupervised (`ProgramConfig(supervise=False)`), Launchpad's `CourierNode` builds a
  server binding every public method and hands it to `set_courier_server`: the node
  serves its own, narrow one on that port instead."""
  from launchpad.nodes.courier import courier_utils  # pylint: disable=g-import-not-at-top
  node, factory, _ = central
  port = portpicker.pick_unused_port()
  node.set_courier_server(courier_utils.make_courier_server(node, port=port))
  own = node._courier  # pylint: disable=protected-access
  own.Start()
  try:
    target = str(tmp_path / 'pwned')
    out = _run_attacker(f'''
      client = courier.Client('localhost:{port}')
      for call in (lambda: client.finish(None), lambda: client.shutdown(),
                   lambda: client.step(Evil({target!r}))):
        try:
          call()
          print('ANSWERED')
        except Exception as e:
          print('ERROR', str(e).replace(chr(10), ' ')[-300:])
    ''')
    lines = out.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith('ERROR') for line in lines), out
    assert 'refused to rebuild posix.mkdir' in lines[2]
    assert not os.path.exists(target)
    assert _valid_step(f'localhost:{port}', factory)['action'].shape == (2,)
  finally:
    own.Stop()
    own.Join()
    node._courier = None  # pylint: disable=protected-access


# A guarded node that is sent `io.open(path, 'w')`, then crashes three ways (issue 62).
_CRASHING_NODE = '''
import _thread, sys, threading, time
sys.path.insert(0, sys.argv[1])
import courier
from seedacme.wire import courier_guard
courier_guard.install()
server = courier.Server(port=int(sys.argv[2]))
server.Bind('take', courier_guard.served(lambda value: 'took', 'take'))
server.Bind('ping', lambda *args: True)
server.Start()
sys.stdin.read()  # until the test has sent its payload
server.Stop()
def in_a_thread():
  raise ValueError('the thread cause')
first = threading.Thread(target=in_a_thread)
first.start()
first.join()  # one crash printed at a time: their lines do not interleave
started = []
def in_a_raw_thread():
  started.append(1)
  raise KeyError('the raw thread cause')
_thread.start_new_thread(in_a_raw_thread, ())
while not started or _thread._count():  # until the raw thread has printed and ended
  time.sleep(0.05)
def crash():
  raise RuntimeError('the top-level cause')
crash()
'''

_SEND_IO_OPEN = '''
import sys
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit.courier_fuzzing import Reduced
try:
  print(courier.Client(sys.argv[2], call_timeout=10).take(Reduced('io', 'open', (sys.argv[3], 'w'))))
except Exception as e:
  print('ERROR', str(e).replace(chr(10), ' '))
'''


@pytest.mark.timeout(120)
def test_a_crash_prints_its_whole_traceback_and_io_open_stays_refused(tmp_path):
  """The interpreter's own traceback printer imports `io` with no Python frame at the
  top level and on a `_thread` thread, as Courier's deserializer does: the guard gave it
  a stand-in for `io.open`, and the traceback stopped before the exception's line (old
  code: neither `KeyError: ...` nor `RuntimeError: ...` nor their source lines on
  stderr). Now each crash prints whole, and a payload naming `io.open` sent to the same
  node is still refused by name and writes nothing."""
  from tests.unit import courier_fuzzing as fuzz  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  script = tmp_path / 'node.py'  # a file: the printer shows each frame's source line
  script.write_text(_CRASHING_NODE)
  node = subprocess.Popen([sys.executable, str(script), fuzz.REPO, str(port)],
                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=fuzz.REPO)
  try:
    fuzz._wait_serving(f'localhost:{port}', node)  # pylint: disable=protected-access
    target = tmp_path / 'written'
    sent = subprocess.run([sys.executable, '-c', _SEND_IO_OPEN, fuzz.REPO,
                           f'localhost:{port}', str(target)], capture_output=True,
                          text=True, timeout=60, cwd=fuzz.REPO)
    assert sent.stdout.startswith('ERROR') and 'refused to rebuild io.open' in sent.stdout, (
        sent.stdout, sent.stderr[-2000:])
    assert not target.exists(), 'io.open ran on the node'
    _, stderr = node.communicate('', timeout=60)
  finally:
    node.kill()
    node.wait()
  assert node.returncode == 1, stderr[-3000:]
  for source, cause in (("raise ValueError('the thread cause')",
                         'ValueError: the thread cause'),
                        ("raise KeyError('the raw thread cause')",
                         "KeyError: 'the raw thread cause'"),
                        ("raise RuntimeError('the top-level cause')",
                         'RuntimeError: the top-level cause')):
    assert f'    {source}\n{cause}\n' in stderr, stderr[-3000:]
  assert 'RefusedType' not in stderr and 'Exception ignored in sys.' not in stderr, stderr
