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

Well-formed calls with one field wrong go into the stream too (`Fuzz.semantic`): `step`
with NaN and inf observations, rewards and discounts, wrong dtypes and shapes, more envs
than the server has, 100,000 envs; `report_acting` with every field wrong in turn (the
string trajectory of issue 62 among them) or set to any value; `get_variables` with
1,000 names and names of 100,000 characters.

Two targets, each a separate process, each payload trying to create a marker file:
 - a central node served as programs serve it (`make_central_server`, V-trace on
   Catch, a real Reverb server) and, in the same process, its actor-side twin
   (`inference='actor'`), whose main loop writes a progress record every 0.5 s and
   ends the process if it ends; sent `COUNT` messages over their Courier ports (one
   attacker each) to every method they serve and to names they do not. After the
   fuzz, each wrong field of each served method is refused by name
   (`test_each_wrong_field_is_refused_by_name`);
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

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import portpicker
import pytest

from seedacme.wire import courier_guard
from tests.unit.courier_fuzzing import (BAD_NAMES, COUNT, REPO, SEED, _RSS_BOUND_MB,
                                        _SERVER, _SERVER_RSS_KB_PER_MESSAGE, _attack,
                                        _valid_step, _wait_serving, bad_reports, bad_steps,
                                        good_report, rss_mb)


@pytest.fixture(scope='module', name='nodes')
def _nodes(tmp_path_factory):
  """The fuzz server: the central node and its actor-side twin, one process."""
  tmp = tmp_path_factory.mktemp('fuzz-server')
  ports = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  log = open(tmp / 'server.log', 'w')
  proc = subprocess.Popen([sys.executable, '-c', _SERVER, str(ports[0]), str(tmp / 'run'),
                           str(ports[1])], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
  nodes = types.SimpleNamespace(
      proc=proc, central=f'localhost:{ports[0]}', twin=f'localhost:{ports[1]}',
      progress=str(tmp / 'run-actor-side' / 'progress.jsonl'),
      log=lambda: open(tmp / 'server.log').read()[-3000:])
  try:
    _wait_serving(nodes.central, proc)
    _wait_serving(nodes.twin, proc)
    yield nodes
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    log.close()


def _records(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _call(address, method, message):
  """`method(message)` on seedacme's wire, as actors call; the decoded reply."""
  import courier  # pylint: disable=g-import-not-at-top
  reply = getattr(courier.Client(address, call_timeout=30), method)(
      courier_guard.plain(message))
  return courier_guard.accept(reply, 'reply')


@pytest.mark.timeout(300)
def test_central_server_survives_fuzz(nodes, tmp_path):
  marker = str(tmp_path / 'marker')
  address, proc = nodes.central, nodes.proc
  addresses = [nodes.central, nodes.twin]
  assert 'action' in _valid_step(address)
  warm = _attack(addresses, marker, SEED + 1, 400, proc.pid)
  assert 'action' in _valid_step(address)
  before = rss_mb(proc.pid)
  run = _attack(addresses, marker, SEED, COUNT, proc.pid)
  after = rss_mb(proc.pid)
  assert proc.poll() is None, nodes.log()
  assert 'action' in _valid_step(address)
  assert _call(nodes.twin, 'report_acting', good_report()) is None
  assert not os.path.exists(marker)
  print(f'server: {COUNT} messages in {run["seconds"]:.1f} s ({run["unsendable"]} not '
        f'encodable by the sender), RSS {before:.1f} -> {after:.1f} MB '
        f'(warm-up {warm["seconds"]:.1f} s)')
  assert (after - before) * 1024 < _SERVER_RSS_KB_PER_MESSAGE * COUNT


def _refused(address, method, message, field):
  with pytest.raises(Exception) as error:  # Courier raises the server's refusal so
    _call(address, method, message)
  text = str(error.value)
  assert 'InvalidRequestError' in text and field in text.splitlines()[-1], (field, text)


@pytest.mark.timeout(240)
def test_each_wrong_field_is_refused_by_name(nodes):
  """Issue 62, item 5: one `report_acting` with a string trajectory ended the actor-side
  central node (TypeError in its next progress record). Now every wrong field of
  `step`, `report_acting` and `get_variables` is refused naming it, and the node's main
  loop keeps writing progress."""
  # The call first (on c8a4f53 the node took it, and died of its next record),
  # then the loop must write two more records.
  _refused(nodes.twin, 'report_acting', good_report(trajectory={'items_written': 'many'}),
           'trajectory')
  written = len(_records(nodes.progress)) if os.path.exists(nodes.progress) else 0
  deadline = time.monotonic() + 30
  while len(_records(nodes.progress) if os.path.exists(nodes.progress) else []) < \
      written + 2:
    assert nodes.proc.poll() is None, nodes.log()
    assert time.monotonic() < deadline, 'no progress records after the report'
    time.sleep(0.25)
  for field, request in bad_steps():
    _refused(nodes.central, 'step', request, field)
  for field, report in bad_reports():
    _refused(nodes.twin, 'report_acting', report, field)
  for field, names in BAD_NAMES:
    _refused(nodes.twin, 'get_variables', names, field)
  # Still serving, and counting only what was well-formed.
  assert 'action' in _valid_step(nodes.central)
  steps = _records(nodes.progress)[-1]['env_steps']
  assert _call(nodes.twin, 'report_acting', good_report()) is None
  [variables] = _call(nodes.twin, 'get_variables', ['policy'])
  assert variables and all(isinstance(v, np.ndarray) for v in variables)
  deadline = time.monotonic() + 30
  while _records(nodes.progress)[-1]['env_steps'] < steps + 20:
    assert time.monotonic() < deadline and nodes.proc.poll() is None, nodes.log()
    time.sleep(0.25)
  record = _records(nodes.progress)[-1]
  assert record['trajectory_items_written'] >= 3 and record['requests_refused'] >= 1
  assert nodes.proc.poll() is None, nodes.log()


_HOSTILE = '''
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import courier
from tests.unit import courier_fuzzing as t
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
from tests.unit import courier_fuzzing as t
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
calls(min(count, 400))  # warm-up
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
