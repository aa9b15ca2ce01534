"""The Vertex AI executables run for real (`launchers/emulation.py`): `vertex.py
--emulate` starts every replica of every worker pool from its copied code directory with
a loopback CLUSTER_SPEC, and `cluster.py` (own machines) starts each host's share of the
replicas of one cluster spec -- here two launchers on one machine playing two hosts."""

import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.integration.launch import (TAG_VAR, leftover_processes, target_value,
                                      tmpdir_without_underscore)

pytestmark = pytest.mark.integration


@pytest.mark.long('Vertex executables learn Catch to 0.9: ~70 s, up to 5 min under load')
@pytest.mark.timeout(330)
def test_emulated_vertex_cluster_trains_catch_and_every_replica_exits_0(tmp_path):
  _need_xmanager()
  tag = uuid.uuid4().hex
  tmp = tmpdir_without_underscore('seedacmetest')
  logdir = tmp_path / 'logdir'
  env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path), **{TAG_VAR: tag})
  try:
    done = subprocess.run(
        [sys.executable, '-m', 'seedacme.launchers.vertex', 'catch', 'vtrace', '2', '8',
         '--accelerator', 'none', '--emulate', '--max_seconds', '240', '--target_return',
         '0.9', '--logdir', str(logdir), '--learner_cpu', '2', '--actor_cpu', '1',
         '--replay_cpu', '1'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
  finally:
    leftovers = leftover_processes(tag)
    left = [n for n in os.listdir(tmp) if not n.startswith('__autograph')]
    shutil.rmtree(tmp)
  out = done.stdout + done.stderr
  assert done.returncode == 0, out[-3000:]
  assert not leftovers, leftovers
  ended = re.search(r'replicas ended: (\{.*\})', out).group(1)
  codes = eval(ended)  # pylint: disable=eval-used  (a dict literal printed by the launcher)
  assert len(codes) == 5 and set(codes.values()) == {0}, codes  # replay, learner, 2+1 actors
  logs = ''.join(open(logdir / 'replicas' / name).read() for name in os.listdir(logdir / 'replicas'))
  assert 'from the checkout' not in logs
  import json  # pylint: disable=g-import-not-at-top
  summary = json.load(open(logdir / 'summary.json'))
  assert summary['stop']['kind'] in ('target', 'eval_target'), summary['stop']
  assert target_value(summary) >= 0.9
  assert not left, left  # executables' and staged code's temp dirs removed


def _need_xmanager() -> None:
  """Skip without xmanager, unless CI requires the Vertex path (SEEDACME_REQUIRE_VERTEX=1)."""
  if os.environ.get('SEEDACME_REQUIRE_VERTEX') == '1':
    import xmanager  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  else:
    pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')


@pytest.mark.skipif(not os.environ.get('SEEDACME_SLOW_TESTS'),
                    reason='before a release: 3.5 minutes more; set SEEDACME_SLOW_TESTS=1')
@pytest.mark.long('two launchers of one cluster spec learn Catch to 0.9: ~3.5 min; '
                  'test_emulated_cluster runs the same command per host, in namespaces')
@pytest.mark.timeout(330)
def test_two_hosts_from_one_cluster_spec_train_catch_together(tmp_path):
  # Two "hosts": two own-machines launchers, the same command and cluster spec, each
  # starting its own replicas -- the central node and replay on one, actors and
  # evaluator on the other.
  _need_xmanager()
  import json  # pylint: disable=g-import-not-at-top
  import portpicker  # pylint: disable=g-import-not-at-top
  tag = uuid.uuid4().hex
  logdir = tmp_path / 'logdir'
  ports = [portpicker.pick_unused_port() for _ in range(5)]
  spec = {'replay': [f'127.0.0.1:{ports[0]}'], 'learner': [f'127.0.0.1:{ports[1]}'],
          'actor': [f'127.0.0.1:{p}' for p in ports[2:4]], 'evaluator': [f'127.0.0.1:{ports[4]}']}
  spec_file = tmp_path / 'cluster.json'
  spec_file.write_text(json.dumps(spec))
  hosts = {'a': 'replay/0,learner/0', 'b': 'actor/0,actor/1,evaluator/0'}
  procs, tmps = {}, []
  try:
    for host, replicas in hosts.items():
      tmp = tmpdir_without_underscore('seedacmetest')
      tmps.append(tmp)
      env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path), **{TAG_VAR: tag})
      procs[host] = subprocess.Popen(
          [sys.executable, '-m', 'seedacme.launchers.cluster', 'catch', 'vtrace', '2', '8',
           '--max_seconds', '240', '--target_return', '0.9', '--logdir', str(logdir),
           '--cluster_spec', f'@{spec_file}', '--replicas', replicas,
           '--replica_logs', str(tmp_path / f'replicas_{host}')],
          cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
          text=True)
    outs = {host: p.communicate(timeout=300)[0] for host, p in procs.items()}
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
    leftovers = leftover_processes(tag)
    for tmp in tmps:
      shutil.rmtree(tmp, ignore_errors=True)
  for host, p in procs.items():
    assert p.returncode == 0, outs[host][-3000:]
    assert f'cluster: {len(hosts[host].split(","))} of 5 replicas' in outs[host], outs[host]
    codes = eval(re.search(r'replicas ended: (\{.*\})', outs[host]).group(1))  # pylint: disable=eval-used
    assert set(codes) == set(hosts[host].split(',')) and set(codes.values()) == {0}, codes
    logs = tmp_path / f'replicas_{host}'
    assert 'from the checkout' not in ''.join(open(logs / n).read() for n in os.listdir(logs))
  assert not leftovers, leftovers
  summary = json.load(open(logdir / 'summary.json'))
  assert target_value(summary) >= 0.9, summary['stop']
