"""The long benchmarks stop cleanly on SIGINT and SIGTERM, however they were started.

`bench/mujoco_learning.py`, `pong_learning.py` and `soak.py` stop their program and
write its summary on KeyboardInterrupt. A script a non-interactive shell starts in the
background inherits SIGINT ignored, and `kill` sends SIGTERM; `harness.
interrupt_on_stop_signals()` makes both raise KeyboardInterrupt. Each case starts a
child exactly so (SIGINT ignored before Python starts) and signals it. Bazel ships
bench/harness.py with the unit tests (BUILD, `unit_test_support`); a tree without it
skips.
"""

import os
import signal
import subprocess
import sys

import pytest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), 'bench')
if not os.path.isfile(os.path.join(_BENCH, 'harness.py')):
  pytest.skip('bench/harness.py is not in this tree', allow_module_level=True)

_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
import harness
if sys.argv[2] == 'install':
  harness.interrupt_on_stop_signals()
try:
  print('ready', flush=True)  # inside the try: the signal may come at once
  time.sleep(60)
  print('slept', flush=True)
except KeyboardInterrupt as e:
  print('interrupted', e, flush=True)
"""


def _run(install: bool, signum: int, sleep_s: int = 60) -> 'tuple[int, str]':
  child = _CHILD.replace('time.sleep(60)', f'time.sleep({sleep_s})')
  proc = subprocess.Popen(
      [sys.executable, '-c', child, _BENCH, 'install' if install else 'no'],
      stdout=subprocess.PIPE, text=True,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  try:
    assert proc.stdout.readline().strip() == 'ready'
    proc.send_signal(signum)
    out = proc.stdout.read()
    return proc.wait(30), out
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@pytest.mark.timeout(120)
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_stop_signals_raise_keyboard_interrupt(signum):
  code, out = _run(True, signum)
  assert code == 0
  assert out.strip() == f'interrupted {signal.Signals(signum).name}'


@pytest.mark.timeout(120)
def test_without_it_an_inherited_ignored_sigint_does_nothing():
  """The case the helper exists for: the same child without it sleeps through SIGINT."""
  code, out = _run(False, signal.SIGINT, sleep_s=3)
  assert code == 0
  assert out.strip() == 'slept'
