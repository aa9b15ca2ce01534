"""The README's "compose in Python" path: one call (`launchers.local.launch`) that runs
the program as `run_local` does -- isolated in a private network namespace with only
loopback, node logs in the run's logdir -- from a user's script, end to end."""

import os
import subprocess
import sys
import uuid

import pytest

from seedacme.run.logdir import read_summary
from tests.integration.launch import TAG_VAR, leftover_processes

SCRIPT = '''
import os, socket, sys
import launchpad as lp
from seedacme import envs
from seedacme.agents import vtrace
from seedacme.config import ProgramConfig
from seedacme.launchers import local
from seedacme.nodes import program
from seedacme.types import env_spec_of

factory = envs.make_factory('catch')
spec = env_spec_of(factory(0))
builder = vtrace.VTraceBuilder(vtrace.VTraceConfig(hidden_sizes=(32,)))
config = ProgramConfig(num_actors=1, envs_per_actor=4, num_eval_envs=0, max_seconds=15,
                       logdir=sys.argv[1])
p = program.make_program(builder, factory, spec, config,
                         stop_program=lp.make_program_stopper('local_mp'))
print('network', os.readlink('/proc/self/ns/net'),
      ','.join(sorted(name for _, name in socket.if_nameindex())), flush=True)
local.launch(p, config.logdir).wait()
'''


@pytest.mark.timeout(180)
def test_a_composed_program_runs_isolated_with_its_logs_in_the_logdir(tmp_path):
  script = tmp_path / 'my_program.py'
  script.write_text(SCRIPT)
  logdir = tmp_path / 'run'
  tag = uuid.uuid4().hex
  env = dict(os.environ, TMPDIR=str(tmp_path), HOME=str(tmp_path), **{TAG_VAR: tag})
  env.pop('SEEDACME_PRIVATE_NETNS', None)
  try:
    result = subprocess.run([sys.executable, str(script), str(logdir)], env=env,
                            capture_output=True, text=True, timeout=150, cwd=str(tmp_path))
  finally:
    leftovers = leftover_processes(tag)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [line.split() for line in result.stdout.splitlines() if line.startswith('network')]
  # Once on the host network, then again in the namespace it re-executed itself into.
  assert len(lines) == 2, result.stdout
  assert lines[0][1] == os.readlink('/proc/self/ns/net')
  assert lines[1][1] != lines[0][1] and lines[1][2] == 'lo', lines
  summary = read_summary(str(logdir))
  assert summary is not None and summary['stop']['kind'] == 'time', summary
  assert summary['env_steps'] > 0
  assert os.path.getsize(logdir / 'nodes' / 'learner' / '0') > 0  # not /tmp/launchpad_out
  assert not leftovers, leftovers
