"""The capacity model (bench/capacity.py): its costs, its monotonic shape, its validation.

The model is arithmetic over published measurements, so these tests are fast and need
no TensorFlow. They hold it to what docs/capacity.md says of it: every default cost is
the number its comment names in bench/published/ (recomputed here, so a re-run bench
that moves a number fails until the default follows); resources never hurt (more cores,
an accelerator, more actors) and costs never help; and each row of this machine's acting
runs the module claims is within the tolerance it reports, while the row it does not
claim really misses. Bazel ships bench/capacity.py and the published JSONs with the unit
tests (BUILD, `unit_test_support`); a tree without them skips.
"""

import dataclasses
import importlib.util
import itertools
import os

import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), 'bench', 'capacity.py')
if not os.path.isfile(_PATH):
  pytest.skip('bench/capacity.py is not in this tree (Bazel ships no bench/)',
              allow_module_level=True)
_SPEC = importlib.util.spec_from_file_location('seedacme_bench_capacity', _PATH)
capacity = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(capacity)

ENVS = (capacity.CATCH, capacity.ATARI)
TRANSPORTS = (capacity.COURIER, capacity.SHM)
ACTORS = (1, 2, 3, 8, 64)
KS = (1, 16, 64)


def _hosts(cores, **kw):
  """The host variants each property is checked on, `cores` cores each."""
  yield capacity.Host('acting only', cores, **kw)
  yield capacity.Host('training', cores, reserved_cores=1, train=True, **kw)
  yield capacity.Host('remote actors', cores, actors_on_host=False, link_rtt_us=200, **kw)


def _grid():
  return itertools.product(ENVS, TRANSPORTS, ACTORS, KS)


def _rate(env, tr, host, n, k):
  return capacity.central(env, tr, host, n, k)['rate']


def test_defaults_are_the_published_measurements():
  objects = {'courier': capacity.COURIER, 'shm': capacity.SHM, 'catch': capacity.CATCH,
             'atari': capacity.ATARI, 'host': capacity.THIS_MACHINE}
  derived = capacity.derive()
  assert len(derived) == 19
  for name, value in derived.items():
    obj, field = name.split('.')
    assert getattr(objects[obj], field) == pytest.approx(value, rel=0.01, abs=0.01), name


@pytest.mark.parametrize('accelerator', [False, True])
def test_more_cores_never_lower_throughput(accelerator):
  for env, tr, n, k in _grid():
    for variants in zip(*(_hosts(c, accelerator=accelerator) for c in (2, 3, 4, 8, 16, 32, 96))):
      rates = [_rate(env, tr, host, n, k) for host in variants]
      assert all(b >= a * (1 - 1e-12) for a, b in zip(rates, rates[1:])), (env.name, tr.name,
                                                                           n, k, rates)


@pytest.mark.parametrize('slowdown', [1.0, 100.0])
def test_an_accelerator_never_lowers_throughput(slowdown):
  # However slow the device, inference stays on the CPU where that is faster.
  for env, tr, n, k in _grid():
    for cpu_host, gpu_host in zip(_hosts(16), _hosts(16, accelerator=True,
                                                     device_slowdown=slowdown)):
      assert _rate(env, tr, gpu_host, n, k) >= _rate(env, tr, cpu_host, n, k), (
          env.name, tr.name, cpu_host.name, n, k)
  # and an expensive forward pass goes to the device and gains.
  host = capacity.Host('gpu', 16, accelerator=True)
  pong = capacity.central(capacity.ATARI, capacity.SHM, host, 16, 16)
  assert pong['device'] and pong['rate'] > 5 * _rate(
      capacity.ATARI, capacity.SHM, capacity.Host('cpu', 16), 16, 16)


def test_more_actors_never_lower_throughput():
  for env, tr, _, k in _grid():
    for host in itertools.chain(_hosts(2), _hosts(32, accelerator=True)):
      rates = [_rate(env, tr, host, n, k) for n in range(1, 200)]
      assert all(b >= a * (1 - 1e-12) for a, b in zip(rates, rates[1:])), (env.name, tr.name, k)


@pytest.mark.parametrize('field', ['server_req_us', 'server_req_us_per_env', 'policy_call_us',
                                   'actor_req_us'])
def test_a_larger_request_cost_lowers_throughput(field):
  for env, tr, n, k in _grid():
    dearer = dataclasses.replace(tr, **{field: getattr(tr, field) * 2 + 10})
    for host in _hosts(8, accelerator=True):
      assert _rate(env, dearer, host, n, k) <= _rate(env, tr, host, n, k)
  # Strictly where requests bind: Catch 2 x 16 on this machine.
  dearer = dataclasses.replace(capacity.SHM, **{field: getattr(capacity.SHM, field) * 2 + 10})
  host = capacity.THIS_MACHINE
  assert (_rate(capacity.CATCH, dearer, host, 2, 16)
          < 0.99 * _rate(capacity.CATCH, capacity.SHM, host, 2, 16))


def test_this_machine_is_predicted_within_the_reported_bound():
  rows = capacity.validate()
  claimed = [r for r in rows if r['claimed']]
  for row in claimed:
    assert abs(row['predicted'] / row['measured'] - 1) <= capacity.TOLERANCE, row
  # The configs issue 26 names are among the claims, both transports where measured.
  covered = {(r['env'], r['actors x K'], r['transport']) for r in claimed}
  assert {('catch', '2 x 16', 'courier'), ('catch', '2 x 16', 'shm'),
          ('catch', '2 x 64', 'courier'), ('pong', '2 x 16', 'courier'),
          ('pong', '2 x 16', 'shm')} <= covered
  # Only what passes is claimed: the unclaimed row does miss (docs/capacity.md says by how
  # much), and most claims are independent of the runs that supplied a cost.
  assert all(not r['within'] for r in rows if not r['claimed'])
  assert sum(not r['in_sample'] for r in claimed) >= len(claimed) - 3


def test_the_convoy_is_what_this_machine_measured():
  # Catch 2 x 16 over Courier: the convoy's cores busy (rate x CPU per env step) match the
  # measured 1.35 of 2 (acting_cpu.json), where a server that never idled (the ceiling)
  # would have served ~1.4x more than measured.
  p = capacity.central(capacity.CATCH, capacity.COURIER, capacity.THIS_MACHINE, 2, 16)
  (row,) = [r for r in capacity.load('acting_cpu.json')['rows']
            if (r['env'], r['actors'], r['K']) == ('catch', 2, 16)]
  measured_busy = row['central_per_s'] * row['central_cpu_us_per_step'] / 1e6
  assert p['rate'] * p['cpu_us_per_step'] / 1e6 == pytest.approx(measured_busy, rel=0.1)
  assert p['ceiling'] > 1.3 * row['central_per_s']
