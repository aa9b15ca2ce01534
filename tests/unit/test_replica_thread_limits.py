"""The thread limits of env-only actors on a cluster or Vertex replica, as the replica's
processes see them.

A replica runs Launchpad's `process_entry` with its peers' addresses in `CLUSTER_SPEC`
(`launchers/emulation.py`, `launchers/vertex.py`); nothing gives it the thread limits
`local_resources` gives a local launch, and the replica has imported numpy before any
node code runs. The actor's work runs in its supervised child, which gets them
(`program.ACTOR_ENV`). Here an actor node of a cluster program is bound for Vertex AI
(as `emulation.build_pools` binds it, without xmanager's image build), serialized as
Launchpad serializes it, and run by Launchpad's real `process_entry` in an environment
without the limits; the child's /proc environ is read while it waits for its central
node (none runs), then the replica is stopped with SIGTERM.
"""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from seedacme.launchers import cluster
from seedacme.launchers.program_flags import make_program_inputs
from seedacme.nodes import program as program_lib

LIMITS = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
          'CUDA_VISIBLE_DEVICES': ''}


def _environ(pid: int) -> dict:
  with open(f'/proc/{pid}/environ', 'rb') as f:
    pairs = [item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item]
  return {k.decode(): v.decode() for k, v in pairs}


@pytest.mark.timeout(120)
def test_an_actor_replica_s_work_runs_with_the_thread_limits(tmp_path, wait_until):
  from launchpad import context as lp_context  # pylint: disable=g-import-not-at-top
  from launchpad.launch import serialization  # pylint: disable=g-import-not-at-top
  args = cluster.parse_args(['catch', 'vtrace', '2', '4'])
  factory, spec, builder, config = make_program_inputs(args, str(tmp_path / 'run'))
  program = program_lib.make_program(builder, factory, spec, config, name='t')
  pools = cluster.plan_pools({g: len(n) for g, n in program.groups.items()})
  for nodes in program.groups.values():
    for node in nodes:
      node._initialize_context(lp_context.LaunchType.VERTEX_AI, launch_config=None)  # pylint: disable=protected-access
  for label, nodes in program.groups.items():
    for node in nodes:
      for handle in node.input_handles:
        handle.connect(node, label)
  for pool, labels in pools.items():
    for instance, name in enumerate(labels):
      group, index = name.split('/')
      program.groups[group][int(index)].bind_addresses(cluster=pool, instance=instance)
  job = str(tmp_path / 'job.pkl')
  serialization.serialize_functions(job, 'actor', [n.function for n in program.groups['actor']])
  spec_env = {'cluster': {pool: [f'localhost:{20000 + i}' for i, _ in enumerate(labels)]
                          for pool, labels in pools.items()},
              'task': {'type': 'actor', 'index': 1}}
  env = {k: v for k, v in os.environ.items() if k not in LIMITS}
  env.update(CLUSTER_SPEC=json.dumps(spec_env), OMP_NUM_THREADS='8')
  log = open(tmp_path / 'replica.log', 'w')
  children = []
  replica = subprocess.Popen(
      [sys.executable, '-m', 'launchpad.nodes.python.process_entry', f'--data_file={job}'],
      env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
  try:
    node_process = psutil.Process(replica.pid)
    assert wait_until(lambda: node_process.children() != [] or replica.poll() is not None,
                      60), 'the replica started no child'
    assert replica.poll() is None, open(tmp_path / 'replica.log').read()[-3000:]
    [child] = node_process.children()
    children.append(child)
    assert wait_until(lambda: 'seedacme.runtime.supervisor' in ' '.join(child.cmdline()), 10)
    child_env = _environ(child.pid)
    assert {k: child_env.get(k) for k in LIMITS} == LIMITS
    # The replica's own process has none of them: they are the child's.
    assert _environ(replica.pid)['OMP_NUM_THREADS'] == '8'
  finally:
    if replica.poll() is None:
      replica.send_signal(signal.SIGTERM)
    try:
      replica.wait(30)
    except subprocess.TimeoutExpired:
      replica.kill()
      replica.wait()
    log.close()
  assert replica.returncode == 0, open(tmp_path / 'replica.log').read()[-3000:]
  assert wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                    for c in children), 15)  # nothing left
