"""The Vertex AI executables run for real: `vertex.py --emulate` starts every replica of
every worker pool from its copied code directory with a loopback CLUSTER_SPEC."""

import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.integration.launch import TAG_VAR, leftover_processes

pytestmark = pytest.mark.integration


@pytest.mark.timeout(330)
def test_emulated_vertex_cluster_trains_catch_and_every_replica_exits_0(tmp_path):
  pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')
  tag = uuid.uuid4().hex
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
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
  assert 'target' in summary['stopped_because'], summary['stopped_because']
  assert float(summary['stopped_because'].split()[2]) >= 0.9
  assert os.listdir(tmp) == [] or all(n.startswith('__autograph') for n in os.listdir(tmp)), \
      os.listdir(tmp)
