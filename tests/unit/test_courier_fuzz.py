"""Courier fuzz: no message kills a node, runs code or grows its memory.

A seeded generator of our own (`Fuzz`) builds hostile Courier messages: reduced
objects naming every allowed name with bad arguments, state, items and key/value
pairs; the reported attacks (names read off `typing.io` and `typing.re`, non-module
`sys.modules` entries; `complex('not-a-number')`; numpy's `_reconstruct`, `dtype` and
`ndarray.__setstate__` with forged flags and object fields; `os.mkdir`, `exec`,
`eval`, `copyreg._reconstructor` with a `type()`-made class); nests deep and wide;
arrays of every dtype; plain values of wrong type and arity. A reduced object is sent
the way a caller can: an object whose `__reduce__` returns it (Courier's serializer
calls it on the sending side). To name `(module, name)` the sender has not got,
`_spoof` puts a module in the sender's `sys.modules` whose attribute is the object
being sent, so the sender's own import check passes; only attacker processes do this.

Two targets, each a separate process, each payload trying to create a marker file:
 - a central node served as programs serve it (`make_central_server`, V-trace on
   Catch, a real Reverb server), sent `COUNT` messages over its Courier port to every
   method it serves and to names it does not;
 - an actor-side client with the guard installed, calling a hostile Courier server
   whose every reply is a generated message (sync calls and `futures`).
Each test asserts the target is still running and answers a valid call after and that
the marker never appears, and bounds the target's RSS growth over the run, measured
after a warm-up of 400 messages of another seed (TF and Courier settle in it).

The client's RSS is flat: 113.7 -> 113.7 MB over 400 hostile replies; bound 24 MB.
The server's is not, and no Python-side guard can make it so: Courier 0.5 leaks what it
has built of a message whose rebuilding fails (`DeserializePyObjectUnsafe` holds dicts,
lists, tuples and a reduced object's instance as raw pointers and returns early on an
error, e.g. key/value pairs that are not pairs), and 2% of these messages carry 1-3 MB.
Measured on one server, phases of 1000 messages after a first: +31, +92, +160 MB
(seeds 47, 47, 49); without non-pair key/value pairs still +36, +10, +44 MB. The bound,
`_SERVER_RSS_KB_PER_MESSAGE` (300 KB a message, 600 MB for 2000), is about four times
the growth measured for the default run (+146 MB): it fails a leak faster than
Courier's own, not Courier's; only admitting the run's peers (the TLS tunnel) bounds
that.

Defaults: seed 47, 2000 messages to the server (34 s), 400 replies to the client
(6-13 s): 63 s for the file under load ~10, the server's start (TF) 20-30 s of it.
By hand, longer: `SEEDACME_FUZZ_COUNT=100000 SEEDACME_FUZZ_SEED=5 .venv/bin/python -m
pytest tests/unit/test_courier_fuzz.py -q -s` (the client's count is a fifth of it).
"""

import importlib
import json
import os
import random
import subprocess
import sys
import time
import types

import numpy as np
import portpicker
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEED = int(os.environ.get('SEEDACME_FUZZ_SEED', '47'))
COUNT = int(os.environ.get('SEEDACME_FUZZ_COUNT', '2000'))
_RSS_BOUND_MB = 24  # the client's
_SERVER_RSS_KB_PER_MESSAGE = 300

# Every name the guard allows now or allowed before, and the names of the attacks.
NAMES = (
    ('traceback', 'format_exception'),
    ('numpy', 'ndarray'), ('numpy', 'dtype'),
    ('numpy.core.multiarray', '_reconstruct'), ('numpy.core.multiarray', 'scalar'),
    ('numpy.core._multiarray_umath', '_reconstruct'),
    ('numpy.core._multiarray_umath', 'dtype'), ('numpy.core._multiarray_umath', 'scalar'),
    ('numpy.core._exceptions', '_UFuncNoLoopError'),
    ('builtins', 'set'), ('builtins', 'frozenset'), ('builtins', 'complex'),
    ('builtins', 'exec'), ('builtins', 'eval'), ('builtins', 'getattr'),
    ('builtins', 'type'), ('builtins', 'open'),
    ('copyreg', '__newobj__'), ('copyreg', '_reconstructor'),
    ('typing.io', '__class__'), ('typing.io', '__getattribute__'), ('typing.io', 'IO'),
    ('typing.re', '__class__'), ('typing.re', '__init_subclass__'),
    ('posix', 'mkdir'), ('os', 'system'), ('subprocess', 'run'),
    ('no_such_module_47', 'x'),
    ('seedacme.nodes.service', 'CentralService'), ('importlib', 'import_module'),
)
SERVED = ('step', 'shm_offer', 'report_acting', 'get_variables', 'ping')
UNSERVED = ('finish', 'shutdown', 'run', 'list_methods', 'step_batch')


class _Spoof(types.ModuleType):
  """A sender's `sys.modules[module]`: the registered names, else the real module's."""

  def __init__(self, name, real):
    super().__init__(name)
    object.__setattr__(self, '_fuzz', (real, {}))

  def __getattribute__(self, attr):
    real, names = object.__getattribute__(self, '_fuzz')
    if attr in names:
      return names[attr]
    if attr == '_fuzz':
      return object.__getattribute__(self, '_fuzz')
    return getattr(real, attr)


class _Ref:
  """Stands for `module.name` on the sending side: Courier sends only the two names."""

  def __init__(self, module, name):
    self.__module__, self.__name__ = module, name

  def __call__(self, *args):
    raise TypeError('a reference is only sent')


_refs = {}


def _spoof(module, name):
  """The object a sender's Courier resolves `module.name` to (senders only): the real
  one where the sender has the module (sent under its own name, as numpy pickles do),
  else a `_Ref` in a `_Spoof` put in `sys.modules` (`typing.io` is a class there)."""
  key = (module, name)
  if key in _refs:
    return _refs[key]
  try:
    entry = importlib.import_module(module)
  except ImportError:
    entry = None
  entry = sys.modules.get(module, entry)
  if isinstance(entry, types.ModuleType) and not isinstance(entry, _Spoof):
    real = getattr(entry, name, None)
    if real is not None and getattr(real, '__module__', None):
      _refs[key] = real
      return real
  parts = module.split('.')
  for i in range(1, len(parts) + 1):
    prefix = '.'.join(parts[:i])
    current = sys.modules.get(prefix)
    if not isinstance(current, types.ModuleType) or prefix == module:
      if not isinstance(current, _Spoof):
        sys.modules[prefix] = _Spoof(prefix, current)
  _refs[key] = ref = _Ref(module, name)
  object.__getattribute__(sys.modules[module], '_fuzz')[1][name] = ref
  return ref


class Reduced:
  """Sent as Courier's reduced object `(module.name, args, state, items, kvpairs)`."""

  def __init__(self, module, name, args=(), *rest):
    self.reduced = (_spoof(module, name), tuple(args)) + tuple(rest)

  def __reduce__(self):
    return self.reduced


class Fuzz:
  """The seeded generator: `message()` is one hostile value."""

  def __init__(self, seed, marker, bad_pairs=True):
    self.rng = random.Random(seed)
    self.bad_pairs = bad_pairs
    self.marker = marker
    code = f'open({marker!r}, "w").write("ran")'
    self.code = code
    # Payloads that would create the marker if anything named were called.
    self.attacks = [
        lambda: Reduced('posix', 'mkdir', (marker,)),
        lambda: Reduced('builtins', 'exec', (code,)),
        lambda: Reduced('builtins', 'eval', (code,)),
        lambda: Reduced('builtins', 'open', (marker, 'w')),
        lambda: Reduced('os', 'system', (f'touch {marker}',)),
        lambda: Reduced('subprocess', 'run', (['touch', marker],)),
        # type() by way of a non-module sys.modules entry, a class whose init runs code
        lambda: Reduced('typing.io', '__class__',
                        ('X', (), {'__init__': Reduced('builtins', 'exec', (code,))})),
        lambda: Reduced('typing.re', '__class__', ('Y', (), {})),
        lambda: Reduced('copyreg', '_reconstructor', (
            Reduced('typing.io', '__class__', ('Z', (), {})),
            Reduced('builtins', 'object'), None), {'__setstate__': code}),
        lambda: Reduced('builtins', 'complex', ('not-a-number',), {'x': 1}),
        lambda: Reduced('builtins', 'complex', ('not-a-number',)),
        lambda: Reduced('builtins', 'set', (1,)),  # not iterable
        lambda: Reduced('traceback', 'format_exception', ()),
        lambda: Reduced('traceback', 'format_exception', (None, None, None), {'a': 1},
                        [1, 2], [(1, 2)]),
        lambda: Reduced('numpy', 'dtype', ('O8',), (3, '|', None, None, None, -1, -1, 0x3f)),
        lambda: Reduced('numpy', 'dtype', ('V8',), (3, '|', None, None, None, 8, 1, 0x3f)),
        lambda: Reduced('numpy.core.multiarray', '_reconstruct', (
            Reduced('numpy', 'ndarray'), (0,), b'b'), (
                1, (1,), Reduced('numpy', 'dtype', ('V8',),
                                 (3, '|', None, None, None, 8, 1, 0x3f)),
                False, b'AAAAAAAA')),
        lambda: Reduced('numpy.core.multiarray', '_reconstruct', (
            Reduced('numpy', 'ndarray'), (0,), b'b'), (1, (1,), np.dtype('O'), False,
                                                        b'\x41' * 8)),
        lambda: Reduced('numpy.core.multiarray', 'scalar', (np.dtype('O'), b'A' * 8)),
    ]

  def name(self):
    return self.rng.choice(NAMES)

  def leaf(self):
    r, rng = self.rng.random(), self.rng
    if r < 0.15:
      return rng.choice([0, -1, 1 << 62, -(1 << 63), True, False, None, 0.5,
                         float('nan'), float('inf'), -0.0])
    if r < 0.3:
      return rng.choice(['', 'train', 'eval', 'ids', self.marker, 'x' * 1000,
                         '\udcff'.encode('utf-8', 'surrogatepass').decode('latin-1')])
    if r < 0.4:
      return bytes(rng.getrandbits(8) for _ in range(rng.randrange(64)))
    if r < 0.7:
      dtype = rng.choice(['int64', 'int32', 'uint8', 'float32', 'float64', 'bool',
                          'int8', 'float16', 'complex64', 'U3', 'S3', 'object'])
      shape = tuple(rng.randrange(4) for _ in range(rng.randrange(4)))
      if dtype == 'object':
        array = np.empty(shape, object)
        for i in np.ndindex(*shape):
          array[i] = rng.choice([1, 'a', None])
        return array
      return np.zeros(shape, dtype)
    return rng.choice([np.int64(3), np.float32(0.5), np.bool_(True), np.str_('a')])

  def value(self, depth=0):
    r, rng = self.rng.random(), self.rng
    if depth > 4 or r < 0.35:
      return self.leaf()
    if r < 0.5:
      return [self.value(depth + 1) for _ in range(rng.randrange(4))]
    if r < 0.6:
      return tuple(self.value(depth + 1) for _ in range(rng.randrange(4)))
    if r < 0.75:
      return {rng.choice(['ids', 'transition', 'observation', 'mode', 1, None, b'k']):
              self.value(depth + 1) for _ in range(rng.randrange(4))}
    if r < 0.85:
      return rng.choice(self.attacks)()
    return self.reduced(depth + 1)

  def reduced(self, depth=0):
    """A reduced object of any name, arity and extras."""
    rng = self.rng
    # state: anything; items and key/value pairs: a list or None (Courier's serializer
    # iterates them unchecked: anything else is a SIGSEGV of the sender)
    rest = [self.value(depth + 1),
            rng.choice([None, [self.value(depth + 1) for _ in range(rng.randrange(3))]]),
            rng.choice([None, [(self.value(depth + 1), self.value(depth + 1))]]
                       + [[self.value(depth + 1)]] * self.bad_pairs)][:rng.randrange(4)]
    args = tuple(self.value(depth + 1) for _ in range(rng.randrange(4)))
    return Reduced(*self.name(), args, *rest)

  def nest(self):
    """Deep or wide."""
    rng = self.rng
    if rng.random() < 0.5:
      value = self.reduced()
      for _ in range(rng.choice([30, 60, 90])):
        value = rng.choice([[value], (value,), {'k': value},
                            Reduced('builtins', 'set', ([value],))])
      return value
    return rng.choice([[self.leaf() for _ in range(20000)],
                       {i: self.reduced() for i in range(200)},
                       b'\x00' * (3 << 20), np.zeros((512, 1024), np.float32)])

  def reply(self):
    """One hostile reply."""
    r = self.rng.random()
    if r < 0.02:
      return self.nest()
    if r < 0.35:
      return self.rng.choice(self.attacks)()
    if r < 0.6:
      return self.reduced()
    return self.value()

  def message(self):
    """(method, args) of one call."""
    rng = self.rng
    r = rng.random()
    method = rng.choice(SERVED) if rng.random() < 0.9 else rng.choice(UNSERVED)
    if r < 0.02:
      return method, (self.nest(),)
    if r < 0.35:
      return method, (rng.choice(self.attacks)(),)
    if r < 0.6:
      return method, (self.reduced(),)
    return method, tuple(self.value() for _ in range(rng.choice([0, 1, 1, 1, 2, 3])))


def rss_mb(pid):
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise RuntimeError('no VmRSS')


def alive(pid):
  """Whether process `pid` runs (a dead child stays a zombie until its parent waits)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def send(client, fuzz, count, pid):
  """`count` generated calls through `client` to process `pid`: how many the sender
  could not encode, and at which message `pid` died (None: it did not)."""
  unsendable = 0
  for i in range(count):
    if not alive(pid):
      return unsendable, i
    method, args = fuzz.message()
    try:
      getattr(client, method)(*args)
    except Exception as e:  # pylint: disable=broad-except
      if 'serializ' in str(e) or 'importable' in str(e):
        unsendable += 1
  return unsendable, None if alive(pid) else count


_SERVER = '''
import sys, threading, time
import reverb
from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.nodes.central import CentralNode
from seedacme.nodes.service import make_central_server
port, logdir = int(sys.argv[1]), sys.argv[2]
factory = envs.make_factory('catch')
spec = envs.env_spec_of(factory(0))
builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(unroll_length=5, batch_size=4,
                                                   hidden_sizes=(16,)))
replay = reverb.Server(builder.make_replay_tables(spec), port=None)
config = ProgramConfig(num_actors=1, envs_per_actor=2, num_eval_envs=0, logdir=logdir,
                       max_seconds=None, checkpoint_interval_s=None, transport='courier')
node = CentralNode(builder, spec, config, reverb.Client(f'localhost:{replay.port}'),
                   stop_event=threading.Event())
server = make_central_server(node, port=port, thread_pool_size=4)
server.Start()
print('serving', flush=True)
while True:
  time.sleep(60)
'''

_ATTACKER = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit import test_courier_fuzz as t
address, marker, seed, count, pid = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
client = courier.Client(address, call_timeout=10)
start = time.monotonic()
unsendable, died_at = t.send(client, t.Fuzz(seed, marker, sys.argv[7] == '1'), count, pid)
print(json.dumps({'seconds': time.monotonic() - start, 'unsendable': unsendable,
                  'died_at': died_at}))
'''


def _wait_serving(address, proc, method='ping', timeout=90.0):
  import courier  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, 'the server exited while starting'
    try:
      if getattr(courier.Client(address, call_timeout=2), method)(True) is True:
        return
    except Exception:  # pylint: disable=broad-except
      time.sleep(0.5)
  raise TimeoutError(address)


def _valid_step(address):
  """A well-formed request as an actor sends it; the reply."""
  import courier  # pylint: disable=g-import-not-at-top
  from seedacme.wire import courier_guard  # pylint: disable=g-import-not-at-top
  from seedacme.wire.protocol import make_request  # pylint: disable=g-import-not-at-top
  request = make_request(np.arange(2), np.ones(2, np.int64), np.zeros((2, 10, 5), np.float32),
                         np.zeros(2), np.ones(2), np.zeros(2))
  encode = getattr(courier_guard, 'plain', lambda x: x)  # the sender's wire encoding
  decode = getattr(courier_guard, 'accept', lambda x, _: x)
  return decode(courier.Client(address, call_timeout=30).step(encode(request)), 'reply')


def _attack(address, marker, seed, count, pid, bad_pairs=True):
  result = subprocess.run([sys.executable, '-c', _ATTACKER, REPO, address, marker,
                           str(seed), str(count), str(pid), str(int(bad_pairs))],
                          capture_output=True,
                          text=True, timeout=300, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  run = json.loads(result.stdout.strip().splitlines()[-1])
  assert run['died_at'] is None, f'the server died at message {run["died_at"]} (seed {seed})'
  return run


@pytest.mark.timeout(240)
def test_central_server_survives_fuzz(tmp_path):
  marker = str(tmp_path / 'marker')
  port = portpicker.pick_unused_port()
  address = f'localhost:{port}'
  log = open(tmp_path / 'server.log', 'w')
  proc = subprocess.Popen([sys.executable, '-c', _SERVER, str(port), str(tmp_path / 'run')],
                          stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
  try:
    _wait_serving(address, proc)
    assert 'action' in _valid_step(address)
    warm = _attack(address, marker, SEED + 1, 400, proc.pid)
    assert 'action' in _valid_step(address)
    before = rss_mb(proc.pid)
    run = _attack(address, marker, SEED, COUNT, proc.pid)
    after = rss_mb(proc.pid)
    assert proc.poll() is None, open(tmp_path / 'server.log').read()[-3000:]
    assert 'action' in _valid_step(address)
    assert not os.path.exists(marker)
    print(f'server: {COUNT} messages in {run["seconds"]:.1f} s ({run["unsendable"]} not '
          f'encodable by the sender), RSS {before:.1f} -> {after:.1f} MB '
          f'(warm-up {warm["seconds"]:.1f} s)')
    assert (after - before) * 1024 < _SERVER_RSS_KB_PER_MESSAGE * COUNT
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    log.close()


_HOSTILE = '''
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit import test_courier_fuzz as t
port, marker, seed = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
lock = threading.Lock()
def hostile(fuzz):
  def reply(*args):
    with lock:
      return fuzz.reply()
  return reply
server = courier.Server(port=port, thread_pool_size=2)
for name in t.SERVED:  # futures calls and sync calls, each a generator of its own
  server.Bind(name, hostile(t.Fuzz(seed, marker)))
  server.Bind('sync_' + name, hostile(t.Fuzz(seed + 1, marker)))
server.Bind('echo', lambda x: x)
server.Start()
print('serving', flush=True)
while True:
  time.sleep(60)
'''

_VICTIM = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import courier
from seedacme.wire import courier_guard
from tests.unit import test_courier_fuzz as t
courier_guard.install()
address, count = sys.argv[2], int(sys.argv[3])
client = courier.Client(address, call_timeout=20)
accept = getattr(courier_guard, 'accept', None) or (lambda v, w: courier_guard.check(v, w))
def calls(n):
  refused = 0
  for i in range(n):
    method = t.SERVED[i % len(t.SERVED)]
    try:
      if i % 2:
        reply = getattr(client, 'sync_' + method)(i)
      else:
        reply = getattr(client.futures, method)(i).result(timeout=20)
      accept(reply, 'reply')
    except Exception:  # refused, or Courier could not encode it: either way, not run
      refused += 1
  return refused
calls(min(count, 200))  # warm-up
before = t.rss_mb('self')
start = time.monotonic()
refused = calls(count)
seconds = time.monotonic() - start
after = t.rss_mb('self')
assert client.echo({'a': [1, 2.5, 'x']}) == {'a': [1, 2.5, 'x']}
print(json.dumps({'seconds': seconds, 'refused': refused, 'before': before, 'after': after}))
'''


@pytest.mark.timeout(240)
def test_actor_side_client_survives_hostile_replies(tmp_path):
  marker = str(tmp_path / 'marker')
  port = portpicker.pick_unused_port()
  log = open(tmp_path / 'hostile.log', 'w')
  server = subprocess.Popen([sys.executable, '-c', _HOSTILE, REPO, str(port), marker,
                             str(SEED)], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
  try:
    _wait_serving(f'localhost:{port}', server, 'echo')
    count = max(COUNT // 5, 1)
    victim = subprocess.run([sys.executable, '-c', _VICTIM, REPO, f'localhost:{port}',
                             str(count)], capture_output=True, text=True, timeout=200,
                            cwd=REPO)
    # A SIGSEGV is returncode -11; the last line is written after a valid call answered.
    assert victim.returncode == 0, victim.stderr[-3000:]
    run = json.loads(victim.stdout.strip().splitlines()[-1])
    assert not os.path.exists(marker)
    print(f'client: {count} hostile replies in {run["seconds"]:.1f} s ({run["refused"]} '
          f'refused), RSS {run["before"]:.1f} -> {run["after"]:.1f} MB')
    assert run['after'] - run['before'] < _RSS_BOUND_MB
  finally:
    server.kill()
    server.wait()
    log.close()
