"""Isolation is read from the namespace, not from the marker variable (issue 47).

`launchers/local.py` re-executes itself in a private network namespace and marks the
new process with `SEEDACME_PRIVATE_NETNS`; it trusted the marker alone, so with the
variable set by hand (or inherited) on the host network it neither re-executed nor
refused nor warned, and Courier and Reverb listened on eth0. Each test runs the
launcher as a user would (a second process, the variable set in its environment) on
this host's network and asserts it does not run exposed. Skipped where this process
itself sees nothing but loopback (nothing would be exposed to test).
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    [name for _, name in socket.if_nameindex()] == ['lo'],
    reason='this test process sees loopback only: nothing to be exposed on')


def _run(args, tmp_path, path=None, timeout=60, extra=None):
  env = dict(os.environ, SEEDACME_PRIVATE_NETNS='1', TMPDIR=str(tmp_path), **(extra or {}))
  if path is not None:
    env['PATH'] = path
  proc = subprocess.Popen([sys.executable, *args], cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    pytest.fail(f'still running after {timeout}s (it started exposed?)\n{err[-2000:]}')
  return proc.returncode, out, err


@pytest.mark.timeout(90)
def test_a_marker_set_on_the_host_network_does_not_start_an_exposed_program(tmp_path):
  # No `unshare` and no loopback interposer: it cannot isolate, so it must refuse.
  empty = tmp_path / 'empty_path'
  empty.mkdir()
  code, out, err = _run(['-m', 'seedacme.launchers.local', 'catch', 'vtrace', '1',
                         '--max_seconds', '30', '--logdir', str(tmp_path / 'run')],
                        tmp_path, path=str(empty),
                        extra={'SEEDACME_LOOPBACK_LIBRARY': str(tmp_path / 'none.so')})
  assert code == 2, (out, err[-3000:])
  assert 'SEEDACME_PRIVATE_NETNS is set, but this process sees network interfaces' in err
  assert 'cannot isolate the network (namespace: unshare is not installed' in err
  assert not os.path.exists(tmp_path / 'run' / 'nodes'), 'nodes were started'


@pytest.mark.needs_namespaces
@pytest.mark.timeout(60)
def test_a_marker_set_on_the_host_network_re_executes_into_loopback_only(tmp_path):
  script = tmp_path / 'probe.py'
  script.write_text(textwrap.dedent('''
      import socket, sys
      from seedacme.launchers import local
      problem = local.isolation_problem([sys.executable, __file__])
      print('ran with', problem, [name for _, name in socket.if_nameindex()], flush=True)
  '''))
  code, out, err = _run([str(script)], tmp_path)
  assert code == 0, err
  assert out.strip() == "ran with None ['lo']", (out, err)  # ran once, inside
