"""The README's "compose in Python" path: one call (`launchers.local.launch`) that runs
the program as `run_local` does -- isolated in a private network namespace with only
loopback, or on a host without namespaces its nodes' servers kept on loopback (issue
64), node logs in the run's logdir -- from a user's script, end to end."""

import os
import subprocess
import sys
import time
import uuid

import pytest

from seedacme.run.logdir import read_summary
from seedacme.runtime import isolation
from tests.integration.launch import TAG_VAR, check_servers_isolated, leftover_processes

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


def _check_while_serving(proc, tag, stderr_path) -> str | None:
  """Once the program's Courier and Reverb listen, `check_servers_isolated` on them;
  the mechanism it checked (None: the program ended first)."""
  deadline = time.monotonic() + 120
  while proc.poll() is None and time.monotonic() < deadline:
    pids = leftover_processes(tag)
    if len({s.port for s in isolation.listening_sockets(pids) if s.proto == 'tcp'}) >= 2:
      with open(stderr_path) as f:
        return check_servers_isolated(f.read(), pids)
    time.sleep(0.5)
  return None


@pytest.mark.timeout(180)
def test_a_composed_program_runs_isolated_with_its_logs_in_the_logdir(tmp_path):
  script = tmp_path / 'my_program.py'
  script.write_text(SCRIPT)
  logdir = tmp_path / 'run'
  tag = uuid.uuid4().hex
  env = dict(os.environ, TMPDIR=str(tmp_path), HOME=str(tmp_path), **{TAG_VAR: tag})
  env.pop('SEEDACME_PRIVATE_NETNS', None)
  out_path, err_path = tmp_path / 'stdout.txt', tmp_path / 'stderr.txt'
  with open(out_path, 'w') as out, open(err_path, 'w') as err:
    proc = subprocess.Popen([sys.executable, str(script), str(logdir)], env=env,
                            stdout=out, stderr=err, cwd=str(tmp_path))
  try:
    mechanism = _check_while_serving(proc, tag, err_path)
    returncode = proc.wait(timeout=150)
  finally:
    if proc.poll() is None:
      proc.kill()
    leftovers = leftover_processes(tag)
  stdout, stderr = out_path.read_text(), err_path.read_text()
  assert returncode == 0, stderr[-3000:]
  assert mechanism is not None, ('the program ended before its servers were seen',
                                 stderr[-3000:])
  lines = [line.split() for line in stdout.splitlines() if line.startswith('network')]
  assert lines[0][1] == os.readlink('/proc/self/ns/net'), lines
  if mechanism == 'namespace':
    # Once on the host network, then again in the namespace it re-executed itself into.
    assert len(lines) == 2, stdout
    assert lines[1][1] != lines[0][1] and lines[1][2] == 'lo', lines
  else:  # no namespace here: the script ran once, its nodes' servers on loopback
    assert len(lines) == 1, stdout
    assert 'refuses connections from other uids' in stderr, stderr[:3000]
  summary = read_summary(str(logdir))
  assert summary is not None and summary['stop']['kind'] == 'time', summary
  assert summary['env_steps'] > 0
  assert os.path.getsize(logdir / 'nodes' / 'learner' / '0') > 0  # not /tmp/launchpad_out
  assert not leftovers, leftovers
