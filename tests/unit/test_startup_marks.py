"""Start-up marks (`seedacme.runtime.startup`) and `bench/startup.py`'s reading of them.

A mark is one parseable line whose `+seconds` is the process's age (interpreter start
included, so at least what ran before the mark, at most the process's whole life); it
never raises and imports no TensorFlow. The bench finds every process's phases in a
logdir's node logs (a supervisor's lines and its child's share one file) and the
launcher's stdout.
"""

import os
import subprocess
import sys
import time

from seedacme.runtime import startup
from tests.unit.bench_modules import load

bench_startup = load('startup')

_CHILD = """
import sys, time
from absl import logging
logging.use_absl_handler()
logging.set_verbosity(logging.INFO)
time.sleep(0.5)
from seedacme.runtime import startup
startup.mark('actor/3', 'envs_built')
print('tensorflow' in sys.modules, flush=True)
"""


def test_a_mark_logs_a_parseable_line_with_the_process_age():
  before = time.time()
  child = subprocess.Popen([sys.executable, '-c', _CHILD], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  out, err = child.communicate(timeout=60)
  lifetime = time.time() - before
  assert child.returncode == 0, err
  assert out.strip() == 'False'  # no TensorFlow
  lines = [line for line in err.splitlines() if 'startup:' in line]
  assert len(lines) == 1, err
  m = startup.LINE_RE.search(lines[0])
  assert m and m['node'] == 'actor/3' and m['phase'] == 'envs_built', lines[0]
  assert int(m['pid']) == child.pid
  # The age covers the sleep before the mark and no more than the process lived.
  assert 0.5 <= float(m['since']) < lifetime + 1.0, (lines[0], lifetime)
  assert before - 1.0 <= float(m['at']) <= time.time() + 1.0
  assert bench_startup.absl_time(lines[0], time.localtime().tm_year) is not None


def test_this_process_age_is_plausible():
  import psutil  # pylint: disable=g-import-not-at-top
  age = startup.process_age()
  created = psutil.Process().create_time()  # from btime: whole seconds
  assert age is not None and 0.0 <= age < time.time() - created + 1.0


def test_without_proc_the_line_omits_the_seconds_and_nothing_raises(monkeypatch, tmp_path):
  monkeypatch.setattr(startup, 'STAT_PATH', str(tmp_path / 'no_such_stat'))
  line = startup.line('learner', 'devices')
  assert '+' not in line
  m = startup.LINE_RE.search(line)
  assert m and m['phase'] == 'devices' and m['since'] is None
  startup.mark('learner', 'devices')  # does not raise


def _absl(t: float, message: str, pid_thread: int = 140000000000001) -> str:
  stamp = time.strftime('%m%d %H:%M:%S', time.localtime(t)) + f'{t % 1:.6f}'[1:]
  return f'I{stamp} {pid_thread} file.py:1] {message}\n'


def _mark(t: float, node: str, phase: str, age: float, pid: int) -> str:
  return _absl(t, f'startup: {node} {phase} +{age:.2f}s (at {t:.3f}, pid {pid})')


def test_the_bench_reads_every_process_phases_from_a_logdir(tmp_path):
  t0 = 1795864348.0
  nodes = tmp_path / 'nodes'
  (nodes / 'learner').mkdir(parents=True)
  (nodes / 'actor').mkdir()
  (nodes / 'learner' / '0').write_text(''.join([
      _mark(t0 + 8, 'learner', 'supervising', 2.5, 100),
      _absl(t0 + 8.01, 'learner: started child process 101'),
      'WARNING: Logging before flag parsing goes to stderr.\n',
      _mark(t0 + 10, 'learner', 'imported', 2.0, 101),
      _mark(t0 + 21, 'learner', 'tf_imported', 13.0, 101),
      _absl(t0 + 31, 'Inference batch step compiled in 10.0s (device CPU)'),
      _mark(t0 + 31, 'learner', 'inference_compiled', 23.0, 101),
      _mark(t0 + 31.5, 'learner', 'serving', 23.5, 101),
  ]))
  (nodes / 'actor' / '0').write_text(''.join([
      _mark(t0 + 8, 'actor/0', 'supervising', 2.6, 200),
      _absl(t0 + 8.02, 'actor/0: started child process 201'),
      _mark(t0 + 12, 'actor/0', 'envs_built', 4.0, 201),
      _absl(t0 + 37, 'actor 0: first answer from the inference server after 25.0s (shm)'),
      # Launchpad's countdown ends without a newline; the next line follows on it.
      'Waiting for workers to stop for 10s.' + _mark(t0 + 37, 'actor/0', 'first_answer',
                                                      29.0, 201),
  ]))
  stdout = tmp_path / 'stdout.txt'
  stdout.write_text('seedacme: vtrace on catch ...\n'
                    f'startup: launcher launching +5.40s (at {t0 + 5.4:.3f}, pid 50)\n')
  procs = bench_startup.read_processes(str(tmp_path), str(stdout))
  by_name = {p['process']: p for p in procs}
  assert set(by_name) == {'launcher', 'learner/0 parent', 'learner/0 child',
                          'actor/0 parent', 'actor/0 child'}
  child = by_name['learner/0 child']
  assert child['pid'] == 101
  assert [p['phase'] for p in child['phases']] == [
      'imported', 'tf_imported', 'inference_compiled', 'serving']
  assert abs(child['started_at'] - (t0 + 8)) < 0.01
  assert [p['phase'] for p in by_name['actor/0 child']['phases']] == [
      'envs_built', 'first_answer']
  assert procs[0]['process'] == 'launcher'  # the first process started
  rows = bench_startup.phase_rows(procs, t0)
  serving = next(r for r in rows if r['process'] == 'learner/0 child'
                 and r['phase'] == 'serving')
  assert abs(serving['t_s'] - 31.5) < 0.01 and abs(serving['step_s'] - 0.5) < 0.01
  summary = bench_startup.summarize(procs, t0)
  assert abs(summary['launch_to_first_env_step_s'] - 37.0) < 0.01
  assert summary['first_env_step_by'] == 'actor/0 child'
  assert abs(summary['central_serving_s'] - 31.5) < 0.01
  assert summary['replay_serving_s'] is None
  assert summary['largest_steps'][0]['to_phase'] == 'first_answer'


def test_the_bench_falls_back_to_log_lines_without_marks(tmp_path):
  t0 = time.time() - 100
  os.makedirs(tmp_path / 'nodes' / 'actor')
  (tmp_path / 'nodes' / 'actor' / '0').write_text(''.join([
      _absl(t0 + 8, 'actor/0: started child process 201'),
      _absl(t0 + 30, 'actor 0: first answer from the inference server after 20.0s (shm)'),
  ]))
  procs = bench_startup.read_processes(str(tmp_path))
  assert [(p['process'], p['pid']) for p in procs] == [('actor/0 child', 201)]
  summary = bench_startup.summarize(procs, t0)
  assert abs(summary['launch_to_first_env_step_s'] - 30.0) < 0.01
