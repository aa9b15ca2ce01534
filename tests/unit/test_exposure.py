"""Exposure closed by default: nothing listens beyond loopback unless the user says so.

`run_local` and `seedacme.launchers.local.launch` refuse to start where they cannot
isolate the program's network at all (here: `unshare` not on PATH, so no namespace, and
the loopback interposer missing), naming why and how to run exposed; the cluster launcher with `--network host` refuses a cluster spec with an
address outside loopback and private ranges unless `--allow_public_addresses` (by
default it is isolated: only its mutual-TLS endpoint listens there,
tests/unit/test_tls_tunnel.py). The address check runs on parsed specs: nothing is connected to (names resolve through a stand-in resolver).
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from seedacme.launchers import cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, tmp_path, timeout=60):
  """`python args...` with nothing on PATH (no `unshare`, no `ip`) and no loopback
  interposer; killed with its whole session at `timeout` (a launcher that does not
  refuse starts a program)."""
  empty = tmp_path / 'empty_path'
  empty.mkdir(exist_ok=True)
  env = dict(os.environ, PATH=str(empty), TMPDIR=str(tmp_path),
             SEEDACME_LOOPBACK_LIBRARY=str(tmp_path / 'not_built.so'))
  env.pop('SEEDACME_PRIVATE_NETNS', None)
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
def test_run_local_refuses_to_run_exposed_when_it_cannot_isolate(tmp_path):
  code, out, err = _run(['-m', 'seedacme.launchers.local', 'catch', 'vtrace', '1',
                         '--max_seconds', '30', '--logdir', str(tmp_path / 'run')], tmp_path)
  assert code == 2, (out, err)
  assert 'cannot isolate the network (namespace: unshare is not installed' in err
  assert 'loopback: ' in err and 'not_built.so is not built' in err
  assert 'no authentication' in err and '--network host' in err
  assert not os.path.exists(tmp_path / 'run' / 'nodes'), 'nodes were started'


@pytest.mark.timeout(90)
def test_the_python_launch_call_refuses_to_run_exposed_when_it_cannot_isolate(tmp_path):
  script = tmp_path / 'my_program.py'
  script.write_text(
      'from seedacme.launchers import local\n'
      'try:\n'
      '  local.launch(object(), logdir="unused")\n'
      'except local.ExposureError as e:\n'
      '  print("refused:", e)\n')
  code, out, err = _run([str(script)], tmp_path)
  assert code == 0, err
  assert out.startswith('refused: cannot isolate the network (namespace: unshare is not '
                        'installed'), out
  assert 'not_built.so is not built' in out
  assert 'network="host"' in out


def _spec(**pools):
  return json.dumps({'replay': ['10.0.0.1:7000'], 'learner': ['10.0.0.1:7001'],
                     'actor': ['10.0.0.2:7002'], 'evaluator': ['10.0.0.2:7003'], **pools})


@pytest.mark.parametrize('address', ['8.8.8.8:7002', '[2001:4860::1]:7002', '0.0.0.0:7002',
                                     '172.32.0.1:7002'])
def test_the_cluster_launcher_refuses_public_addresses(address, capsys):
  args = ['catch', 'vtrace', '1', '--dry_run', '--network', 'host', '--cluster_spec',
          _spec(actor=[address])]
  assert cluster.main(args) == 2
  err = capsys.readouterr().err
  assert f'refusing addresses outside loopback and private networks: {address}' in err
  assert 'no authentication' in err and '--allow_public_addresses' in err
  assert cluster.main(args + ['--allow_public_addresses']) == 0


@pytest.mark.parametrize('address', ['127.0.0.1:7002', '192.168.4.2:7002', '172.20.0.3:7002',
                                     '100.101.1.2:7002', '[fd12::3]:7002', '[::1]:7002'])
def test_the_cluster_launcher_accepts_loopback_and_private_addresses(address, capsys):
  assert cluster.main(['catch', 'vtrace', '1', '--dry_run', '--network', 'host',
                       '--cluster_spec', _spec(actor=[address])]) == 0
  assert 'no authentication' in capsys.readouterr().err  # said plainly all the same


def test_isolated_by_default_a_public_address_is_only_a_tls_port(capsys):
  """Isolated (the default), nothing but the run's mutual-TLS endpoint listens on a
  host's spec address, so the address check that guarded every port does not apply."""
  assert cluster.main(['catch', 'vtrace', '1', '--dry_run', '--cluster_spec',
                       _spec(actor=['8.8.8.8:7002'])]) == 0
  assert 'refusing' not in capsys.readouterr().err


def test_host_names_are_checked_by_what_they_resolve_to():
  names = {'gpu-host': ['10.2.0.5'], 'web': ['10.0.0.9', '203.0.113.7'], 'gone': []}
  spec = {'learner': ['gpu-host:7000'], 'actor': ['web:7001', 'gone:7002']}
  assert cluster.public_addresses(spec, resolve=names.__getitem__) == [
      'web:7001 (10.0.0.9, 203.0.113.7)', 'gone:7002 (does not resolve)']


def test_isolated_replicas_refuse_a_bucket_logdir(capsys):
  """Isolated replicas reach loopback and the run's hosts only: a gs:// logdir would fail
  at the first checkpoint, minutes in; the launcher says so before starting."""
  args = ['catch', 'vtrace', '1', '--dry_run', '--logdir', 'gs://bucket/run']
  assert cluster.main(args) == 2
  assert '--network isolated cannot use the logdir gs://bucket/run' in capsys.readouterr().err
  assert cluster.main(args + ['--network', 'host']) == 0
