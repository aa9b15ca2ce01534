"""The Courier fuzzer's parts: the seeded message generator (`Fuzz`), the processes it
attacks (`_SERVER`, `_ATTACKER`) and the helpers that watch them.

Kept out of the test files (test_courier_fuzz, test_courier_attacks,
test_courier_raw_messages all use them) so each test file runs alone, as Bazel runs
one per target with only the support files beside it. What the fuzz covers and its
bounds: tests/unit/test_courier_fuzz.py.
"""

import functools
import importlib
import json
import os
import random
import subprocess
import sys
import time
import types

import numpy as np

from seedacme.wire.courier_guard import plain

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
    # the module Courier's server imports for each error: a name of it must not pass
    ('traceback', 'print_exc'), ('traceback', 'sys'), ('traceback', 'linecache'),
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


# ---- Well-formed calls with one field wrong (issue 62): each refusal names the field.
# The fuzz server's program (`_SERVER`): Catch, observations [10, 5] float32, one actor
# of 2 envs; its actor-side twin adds an evaluator of 2 envs (sources 0 and 2).
_OBSERVATION = (10, 5)


def good_step(k=2):
  """A step request as the fuzz server's actor sends it (FIRST steps of `k` envs)."""
  from seedacme.wire.protocol import make_request  # pylint: disable=g-import-not-at-top
  return make_request(np.arange(k), np.ones(k, np.int64),
                      np.zeros((k, *_OBSERVATION), np.float32), np.zeros(k), np.ones(k),
                      np.zeros(k))


def good_report(**changes):
  """What the actor-side twin's training actor (source 0, 2 envs) sends, as
  `ActorSideInference.take_report` builds it."""
  report = {'source': 0, 'batches': 10, 'units': 20, 'full_batches': 10,
            'mean_latency_ms': 1.5, 'p99_latency_ms': 4.0,
            'trajectory': {'sequences': 3, 'items_written': 3, 'writer_pending': 0,
                           'writer_blocked_s': 0.25, 'items_rewritten': 0,
                           'writer_reconnects': 0},
            'env_steps': 20, 'train_episodes': np.array([[1.0, -1.0], [9.0, 9.0]]),
            'eval_env_steps': 0, 'eval_episodes': np.zeros((2, 0))}
  report.update(changes)
  return report


def _transition(row, values):
  request = good_step()
  transition = request['transition'].copy()
  transition[row] = values
  return {**request, 'transition': transition}


@functools.lru_cache(None)
def bad_steps():
  """(field, request): a step request with `field` wrong: NaN and inf, wrong dtypes and
  shapes, batches larger than the server's envs or than any request may be."""
  nan, inf = float('nan'), float('inf')
  good = good_step()
  def obs(value):
    return {**good, 'observation': value}
  return (
      ('observation', obs(np.full((2, *_OBSERVATION), nan, np.float32))),
      ('observation', obs(np.full((2, *_OBSERVATION), -inf, np.float32))),
      ('observation', obs(np.zeros((2, *_OBSERVATION), np.float64))),
      ('observation', obs(np.zeros((2, *_OBSERVATION), np.uint8))),
      ('observation', obs(np.zeros((2, *_OBSERVATION), np.int32))),
      ('observation', obs(np.zeros((2, 5, 10), np.float32))),
      ('observation', obs(np.zeros((2, 10, 5000), np.float32))),  # 400 KB
      ('observation', obs([[0.0] * 5] * 10)),
      ('observation', {k: v for k, v in good.items() if k != 'observation'}),
      ('reward', _transition(0, [0.0, nan])),
      ('reward', _transition(0, [inf, 0.0])),
      ('reward', _transition(0, [0.0, 1e30])),
      ('discount', _transition(1, [nan, 1.0])),
      ('discount', _transition(1, [1.0, 1.5])),
      ('step_type', _transition(2, [0.0, 7.0])),
      ('step_type', _transition(2, [0.5, 1.0])),
      ('step_type', _transition(2, [nan, 1.0])),
      ('transition', {**good, 'transition': good['transition'].astype(str)}),  # a list
      ('transition', {**good, 'transition': good['transition'] > 0}),
      ('transition', {**good, 'transition': np.zeros((3, 3), np.float32)}),
      ('ids', {**good, 'ids': good['ids'].astype(np.float32)}),
      ('ids', {**good, 'ids': np.zeros((3, 2), np.int64)}),
      ('env_ids', {**good, 'ids': np.array([[0, 5], [1, 1]])}),
      ('env_ids', {**good, 'ids': np.array([[1, 1], [1, 1]])}),
      ('env_ids', good_step(3)),  # more envs than the server has
      ('env_ids', {**good, 'ids': np.zeros((2, 100_000), np.int64)}),  # 1.6 MB
      ('mode', {**good, 'mode': 'greedy'}),
      ('mode', {**good, 'mode': 3}),
      ('bogus', {**good, 'bogus': 1}),
  )


@functools.lru_cache(None)
def bad_reports():
  """(field, report): the actor-side twin's training report with `field` wrong, every
  field in turn: type, range, NaN, figures no actor of the program can send."""
  nan, inf = float('nan'), float('inf')
  cases = [
      ('source', 'x'), ('source', -1), ('source', 1.5), ('source', None),
      ('source', 1), ('source', 4), ('source', 2**40),
      ('batches', -1), ('batches', 'x'), ('batches', 2.0), ('batches', True),
      ('units', 21), ('units', 5), ('units', -3),
      ('full_batches', 11), ('full_batches', None),
      ('mean_latency_ms', nan), ('mean_latency_ms', inf), ('mean_latency_ms', -1.0),
      ('mean_latency_ms', 'fast'), ('p99_latency_ms', nan), ('p99_latency_ms', 1e12),
      ('trajectory', 'x' * 50), ('trajectory', ['items_written']),
      ('trajectory', {'items_written': 'x'}), ('trajectory', {'items_written': nan}),
      ('trajectory', {'items_written': -1}), ('trajectory', {'items_written': inf}),
      ('trajectory', {'bogus': 1}), ('trajectory', {7: 1}),
      ('env_steps', -5), ('env_steps', 'x'), ('env_steps', 1.5), ('env_steps', 10**9),
      ('env_steps', 2**60), ('eval_env_steps', 5),
      ('train_episodes', 'x'), ('train_episodes', [[1.0], [9.0]]),
      ('train_episodes', np.zeros(3)), ('train_episodes', np.array([[nan], [9.0]])),
      ('train_episodes', np.array([[inf], [9.0]])),
      ('train_episodes', np.array([[1e9], [9.0]])),
      ('train_episodes', np.array([[1.0], [0.0]])),
      ('train_episodes', np.array([[1.0], [2.5]])),
      ('train_episodes', np.array([[1.0], [-9.0]])),
      ('train_episodes', np.ones((2, 100))),
      ('train_episodes', np.ones((2, 1), str)), ('train_episodes', np.ones((2, 1), bool)),
      ('eval_episodes', np.array([[1.0], [9.0]])),
      ('env_faults', 'x'), ('env_faults', [{}]),
  ]
  out = [(field, good_report(**{field: value})) for field, value in cases]
  missing = good_report()
  del missing['trajectory']
  return tuple(out + [('trajectory', missing), ('bogus', good_report(bogus=1)),
                      ('dict', ['not', 'a', 'dict'])])


BAD_NAMES = (('names', 'policy'), ('names', ['policy'] * 1000), ('names', []),
             ('names[0]', [123]), ('names[0]', ['x' * 100_000]), ('names[0]', ['bogus']),
             ('names', ('policy', 'policy')))


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

  def semantic(self):
    """(method, args): a well-formed call on seedacme's wire (`plain`) with one field
    wrong, or a served report with one field set to any value."""
    rng = self.rng
    method = rng.choice(['step', 'report_acting', 'get_variables'])
    if method == 'step':
      message = rng.choice(bad_steps())[1]
    elif method == 'get_variables':
      message = rng.choice(BAD_NAMES)[1]
    elif rng.random() < 0.7:
      message = rng.choice(bad_reports())[1]
    else:
      message = good_report()
      message[rng.choice(sorted(message))] = self.leaf()
    return method, (plain(message),)

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
    if r < 0.72:
      return self.semantic()
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


# The central node as programs serve it; with a second port, also its actor-side twin
# (`inference='actor'`, an evaluator of 2 envs) running its main loop, which writes a
# progress record every 0.5 s and ends this process if it ends.
_SERVER = '''
import dataclasses, os, sys, threading, time, types
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
if len(sys.argv) > 3:
  twin = CentralNode(builder, spec, dataclasses.replace(
      config, inference='actor', num_eval_envs=2, logdir=logdir + '-actor-side',
      progress_interval_s=0.5), reverb.Client(f'localhost:{replay.port}'),
      stop_event=threading.Event())
  twin.set_courier_server(types.SimpleNamespace(port=int(sys.argv[3]), _thread_pool_size=4))
  def run():
    try:
      twin.run()
    finally:
      print('the actor-side node ended', flush=True)
      os._exit(3)
  threading.Thread(target=run, daemon=True).start()
print('serving', flush=True)
while True:
  time.sleep(60)
'''

_ATTACKER = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit import courier_fuzzing as t
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


def _attack(address, marker, seed, count, pid, bad_pairs=True, parallel=2):
  """`count` messages from `parallel` attacker processes at once (seeds `seed`,
  `seed + 1000`, ...): the node's thread pool rebuilds them concurrently, as the import
  gate must allow (Courier's server imports `traceback` for each refusal meanwhile).
  `address`: one, or a list (attacker i sends to `address[i % len(address)]`)."""
  addresses = [address] if isinstance(address, str) else list(address)
  procs = [subprocess.Popen([sys.executable, '-c', _ATTACKER, REPO,
                             addresses[i % len(addresses)], marker,
                             str(seed + 1000 * i), str(count // parallel), str(pid),
                             str(int(bad_pairs))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
           for i in range(parallel)]
  runs = []
  for attacker in procs:
    out, err = attacker.communicate(timeout=300)
    assert attacker.returncode == 0, err[-3000:]
    runs.append(json.loads(out.strip().splitlines()[-1]))
  died = [run['died_at'] for run in runs if run['died_at'] is not None]
  assert not died, f'the server died at message {died[0]} of an attacker (seed {seed})'
  return {'seconds': max(run['seconds'] for run in runs),
          'unsendable': sum(run['unsendable'] for run in runs)}
