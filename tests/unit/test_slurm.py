"""The Slurm launcher's pure parts: flags, the batch script, the cluster spec from an
allocation, ports, seeds and a sweep's aggregation (no Slurm needed)."""

import json
import os
import re

import pytest

from seedacme.launchers import slurm
from seedacme.run import sweeps


def test_seeds_ranges_lists_and_refusals():
  assert slurm.parse_seeds('0-4') == [0, 1, 2, 3, 4]
  assert slurm.parse_seeds('7,0,3') == [0, 3, 7]
  assert slurm.parse_seeds('1-3,9,2') == [1, 2, 3, 9]
  for bad in ('4-1', 'a', '1-', '1,,2'):
    with pytest.raises(ValueError):
      slurm.parse_seeds(bad)


def test_tasks_per_node_and_block_distribution():
  assert slurm.tasks_per_node('2(x3),1') == [2, 2, 2, 1]
  assert slurm.tasks_per_node('1') == [1]
  assert slurm.task_hosts(['a', 'b'], slurm.tasks_per_node('2,1')) == ['a', 'a', 'b']
  with pytest.raises(ValueError):
    slurm.task_hosts(['a'], [1, 1])


def test_replicas_spread_round_robin_with_the_evaluator_last():
  counts = slurm.replica_counts(num_actors=5, num_eval_envs=4)
  assert counts == {'replay': 1, 'learner': 1, 'actor': 5, 'evaluator': 1}
  assignment = slurm.assign_replicas(counts, actor_tasks=2)
  assert assignment[0] == [['replay/0', 'learner/0']]
  assert assignment[1] == [['actor/0', 'actor/2', 'actor/4'],
                           ['actor/1', 'actor/3', 'evaluator/0']]
  assert 'evaluator' not in slurm.replica_counts(2, 0)


def test_spec_from_an_allocation_environment():
  """The batch step's environment (a het job's nodelists and tasks per node) and
  scontrol's answers -> every replica at its task's node address and its own port."""
  environ = {'SLURM_JOB_NODELIST_HET_GROUP_0': 'gpu7',
             'SLURM_TASKS_PER_NODE_HET_GROUP_0': '1',
             'SLURM_JOB_NODELIST_HET_GROUP_1': 'cpu[3-4]',
             'SLURM_TASKS_PER_NODE_HET_GROUP_1': '2(x2)'}
  expand = {'gpu7': ['gpu7'], 'cpu[3-4]': ['cpu3', 'cpu4']}
  addresses = {'gpu7': '10.1.0.7', 'cpu3': '10.1.1.3', 'cpu4': '10.1.1.4'}
  hosts = slurm.allocation_hosts(environ, hostnames=expand.__getitem__,
                                 addresses=lambda names: [addresses[n] for n in names])
  assert hosts == [['10.1.0.7'], ['10.1.1.3', '10.1.1.3', '10.1.1.4', '10.1.1.4']]
  counts = slurm.replica_counts(4, 1)
  ports = slurm.job_ports(1234, sum(counts.values()))
  spec = slurm.derive_spec(counts, slurm.assign_replicas(counts, 4), hosts, ports)
  assert spec == {
      'replay': [f'10.1.0.7:{ports[0]}'], 'learner': [f'10.1.0.7:{ports[1]}'],
      'actor': [f'10.1.1.3:{ports[2]}', f'10.1.1.3:{ports[3]}', f'10.1.1.4:{ports[4]}',
                f'10.1.1.4:{ports[5]}'],
      'evaluator': [f'10.1.1.4:{ports[6]}']}
  with pytest.raises(ValueError, match='not in a heterogeneous'):
    slurm.allocation_hosts({}, hostnames=expand.__getitem__, addresses=list)
  with pytest.raises(ValueError, match='3 tasks planned, 4 allocated'):
    slurm.derive_spec(counts, slurm.assign_replicas(counts, 3), hosts, ports)


def test_node_address_from_scontrol():
  line = ('NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=127.0.0.1 '
          'NodeHostName=localhost Version=22.05.8')
  assert slurm.node_address(line) == '127.0.0.1'
  assert slurm.node_address('NodeName=n2 State=DOWN') is None


def test_job_ports_are_a_block_per_job_within_the_range():
  a = slurm.job_ports(7, 5, (20000, 20100))
  assert a == list(range(20035, 20040))
  assert slurm.job_ports(8, 5, (20000, 20100))[0] == 20040  # the next job, the next block
  assert slurm.job_ports(27, 5, (20000, 20100)) == a  # 20 blocks: ids 20 apart share
  assert all(20000 <= p < 20100 for j in range(100) for p in slurm.job_ports(j, 7, (20000, 20100)))
  with pytest.raises(ValueError):
    slurm.job_ports(1, 50, (20000, 20010))
  with pytest.raises(ValueError):
    slurm.parse_range('30000-20000')


def test_busy_ports_named():
  import socket
  with socket.socket() as s:
    s.bind(('', 0))
    s.listen()
    port = s.getsockname()[1]
    assert slurm.busy_ports([port]) == [port]
  assert slurm.busy_ports([port]) == []


def test_batch_script_has_two_components_and_forwards_the_program_flags(capsys):
  assert slurm.main(['catch', 'vtrace', '3', '8', '--logdir', '/shared/runs/c',
                     '--max_seconds', '60', '--gres', 'gpu:1', '--actor_nodes', '2',
                     '--partition', 'lab', '--time', '1:00:00', '--requeue',
                     '--sbatch_arg=--mem=4G', '--dry_run']) == 0
  script = capsys.readouterr().out
  head, tail = script.split('#SBATCH hetjob\n')
  assert '#SBATCH --gres=gpu:1' in head and '#SBATCH --gres' not in tail
  assert '#SBATCH --requeue' in head and '#SBATCH --output=/shared/runs/c/slurm/slurm-%j.out' in head
  for part in (head, tail):  # each component takes these afresh
    for line in ('--partition=lab', '--time=1:00:00', '--mem=4G'):
      assert f'#SBATCH {line}' in part
  assert '#SBATCH --nodes=2' in tail and '#SBATCH --ntasks=2' in tail
  run = [line for line in script.splitlines() if line.startswith('exec ')][0]
  assert 'seedacme.launchers.slurm batch --logdir /shared/runs/c --seed 0' in run
  assert run.endswith('-- catch vtrace 3 8 --max_seconds 60')
  assert 'nothing submitted' in script


def test_the_actors_may_run_in_another_partition(capsys):
  """A lab's GPU nodes and CPU nodes are often two partitions: the learner's component
  in one, the actors' in the other (a heterogeneous job's components may differ)."""
  assert slurm.main(['catch', 'vtrace', '2', '--logdir', '/shared/runs/c', '--gres',
                     'gpu:1', '--partition', 'gpu', '--actor_partition', 'cpu',
                     '--dry_run']) == 0
  head, tail = capsys.readouterr().out.split('#SBATCH hetjob\n')
  assert '#SBATCH --partition=gpu' in head and '--partition=cpu' not in head
  assert '#SBATCH --partition=cpu' in tail and '--partition=gpu' not in tail
  assert slurm.main(['catch', 'vtrace', '2', '--logdir', '/shared/runs/c',
                     '--dry_run']) == 0  # neither: Slurm's default partition
  assert '--partition' not in capsys.readouterr().out


def test_a_sweep_is_one_job_per_seed_in_its_own_logdir(capsys):
  assert slurm.main(['catch', 'vtrace', '2', '--logdir', '/shared/sweep', '--seeds', '0-2',
                     '--dry_run']) == 0
  out = capsys.readouterr().out
  assert out.count('#!/bin/bash') == 3
  for seed in range(3):
    assert f'--logdir /shared/sweep/seed_{seed} --seed {seed}' in out
    assert f'--job-name=seedacme-catch-vtrace-seed{seed}' in out


@pytest.mark.parametrize('flags, error', [
    (['--logdir', 'runs/c'], 'must be absolute'),
    ([], '--logdir is required'),
    (['--logdir', '/x', '--cluster_spec', '{}'], 'set by the Slurm launcher'),
    (['--logdir', '/x', '--seeds', '3-1'], 'runs backwards'),
    (['--logdir', '/x', '--actor_nodes', '2', '--actor_tasks', '1'], '--actor_nodes'),
    (['--logdir', 'gs://b/run'], '--network isolated cannot use the logdir gs://b/run'),
])
def test_refused_flags_name_the_problem(flags, error, capsys):
  with pytest.raises(SystemExit) as e:
    slurm.main(['catch', 'vtrace', '2', *flags, '--dry_run'])
  assert e.value.code == 2
  assert error in capsys.readouterr().err


def test_a_bucket_logdir_is_accepted_on_the_host_network(capsys):
  assert slurm.main(['catch', 'vtrace', '2', '--logdir', 'gs://b/run', '--network', 'host',
                     '--dry_run']) == 0
  assert '--logdir gs://b/run' in capsys.readouterr().out


def test_summary_marked_only_when_a_stop_was_requested():
  summary = {'stopped_because': 'stop requested', 'stop': {'kind': 'stop_requested'}}
  marked = slurm.mark_summary(summary, '42', '1')
  assert 'Slurm' in marked['stopped_because'] and 'job 42' in marked['stopped_because']
  assert marked['stop']['kind'] == 'stop_requested'
  assert marked['scheduler'] == {'name': 'slurm', 'job_id': '42', 'restart_count': 1}
  budget = {'stopped_because': 'reached 100 env steps', 'stop': {'kind': 'env_steps'}}
  assert slurm.mark_summary(budget, '42', '0') is budget


def _records(points, metric='eval_average_return'):
  return [{'env_steps': s, 'elapsed_s': i, 'episodes': 1000, metric: r}
          for i, (s, r) in enumerate(points)]


def test_value_at_is_the_last_record_by_then():
  curve = [(100, 0.1), (200, 0.5), (300, 0.9)]
  assert sweeps.value_at(curve, 50) is None
  assert sweeps.value_at(curve, 250) == 0.5
  assert sweeps.value_at(curve, 300) == 0.9


def test_aggregate_median_and_range_at_fixed_env_steps():
  curves = {
      0: [(1000, 0.0), (2000, 0.4), (3000, 0.8)],
      1: [(1000, 0.2), (2000, 0.6), (3000, 1.0), (4000, 1.0)],
      2: [(1500, -0.2), (3100, 0.5)],
  }
  result = sweeps.aggregate(curves, every=1000)
  assert result['env_steps_every_seed_reached'] == 3000
  rows = {r['env_steps']: r for r in result['points']}
  assert sorted(rows) == [1000, 2000, 3000]
  # Seed 2's first record is at 1500: no median of the other two at 1000.
  assert rows[1000]['seeds'] == 2 and rows[1000]['median'] is None
  assert rows[1000]['min'] is None and rows[1000]['per_seed']['0'] == 0.0
  assert rows[2000]['median'] == pytest.approx(0.4)  # of 0.4, 0.6, -0.2
  assert (rows[2000]['min'], rows[2000]['max']) == (-0.2, 0.6)
  assert rows[3000]['per_seed'] == {'0': 0.8, '1': 1.0, '2': -0.2}
  assert result['final'] == {'0': 0.8, '1': 1.0, '2': 0.5}
  evenly = sweeps.aggregate(curves, points=3)
  assert [r['env_steps'] for r in evenly['points']] == [1000, 2000, 3000]


def test_aggregate_command_reads_seed_logdirs_and_writes_table_json_png(tmp_path, capsys):
  for seed, points in ((0, [(1000, 0.1), (2000, 0.5)]), (1, [(1000, 0.3), (2000, 0.9)])):
    d = tmp_path / f'seed_{seed}'
    d.mkdir()
    with open(d / 'progress.jsonl', 'w') as f:
      for r in _records(points):
        f.write(json.dumps(r) + '\n')
  (tmp_path / 'not_a_seed').mkdir()
  assert slurm.main(['aggregate', str(tmp_path), '--every', '1000']) == 0
  out = capsys.readouterr().out
  assert 'median' in out and '0.700' in out  # median of 0.5 and 0.9 at 2000
  result = json.loads((tmp_path / 'aggregate.json').read_text())
  assert result['seeds'] == [0, 1] and result['metric'] == 'eval_average_return'
  assert os.path.getsize(tmp_path / 'aggregate.png') > 1000
  assert slurm.main(['aggregate', str(tmp_path / 'not_a_seed')]) == 1


def test_a_killed_tasks_temp_dir_is_removed_by_the_next_task(tmp_path):
  """A task SIGKILLed leaves its temp dir; the next task on the node removes it, and
  leaves alone a live task's dir, one without a pid file yet, and other files."""
  def task_dir(name, pid):
    path = tmp_path / f'{slurm.TASK_TMP_PREFIX}{name}'
    path.mkdir()
    if pid is not None:
      (path / 'pid').write_text(str(pid))
    return path
  dead = task_dir('7-1-0', 4_000_001)
  live = task_dir('8-0-0', os.getpid())
  starting = task_dir('8-1-0', None)
  other = tmp_path / 'unrelated'
  other.mkdir()
  removed = slurm.remove_stale_task_dirs(str(tmp_path), alive=lambda pid: pid == os.getpid())
  assert removed == [str(dead)]
  assert not dead.exists() and live.exists() and starting.exists() and other.exists()


# ---- Issue 62, item 7: no value can end a line of the sbatch script ---------------

@pytest.mark.parametrize('flags, named, char', [
    (['--job_name', 'x\n touch /tmp/pwned'], '--job_name', 'U+000A'),  # the issue's
    (['--logdir', '/shared/runs/c\ntouch /tmp/pwned'], '--logdir', 'U+000A'),
    (['--partition', 'gpu\r'], '--partition', 'U+000D'),
    (['--account', 'lab\x00'], '--account', 'U+0000'),
    (['--time', '1:00:00\x1b[2J'], '--time', 'U+001B'),
    (['--gres', 'gpu:1\u2028id'], '--gres', 'U+2028'),
    (['--sbatch_arg=--mem=4G\nid'], '--sbatch_arg', 'U+000A'),
    (['--port_range', '20000-30000\n'], '--port_range', 'U+000A'),
    (['--actor_partition', 'cpu\x85'], '--actor_partition', 'U+0085'),
    (['--game', 'Pong\nid'], '--game', 'U+000A'),  # a forwarded program flag
    (['--env_config=a=b\x7f'], '--env_config', 'U+007F'),
])
def test_a_control_character_in_any_value_is_refused_naming_the_flag(flags, named, char,
                                                                     capsys):
  with pytest.raises(SystemExit) as e:
    slurm.main(['catch', 'vtrace', '2', '--logdir', '/shared/runs/c', *flags, '--dry_run'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert f'{named} ' in err and 'control character' in err and char in err, err
  assert '#SBATCH' not in err


_PRINTABLE = 'abcXYZ019 -_=:/.,@%+*?[]{}()<>|&;!#~^\'"`$\\é漢'
_CONTROLS = '\n\r\t\x00\x0b\x0c\x1b\x7f\x85\u2028\u2029'


def _value(rng) -> str:
  """Shell-special printable characters; one in ten values also holds a control."""
  text = ''.join(rng.choice(_PRINTABLE) for _ in range(rng.randint(1, 12)))
  if rng.random() < 0.1:
    at = rng.randint(0, len(text))
    text = text[:at] + rng.choice(_CONTROLS) + text[at:]
  return text


def test_batch_script_never_writes_a_line_a_value_made(monkeypatch):
  """For values of every character class (quotes, $, backquotes, ;, \\, controls,
  Unicode line separators) in every field: either `batch_script` refuses, naming a
  value with a control character, or each line of the script is one it means -- each
  #SBATCH line one option as given, the exec line the batch step's argv as given."""
  import argparse
  import random
  import shlex
  rng = random.Random(62)
  fields = ('account', 'time', 'gres', 'partition', 'actor_partition', 'port_range')
  refused = written = 0
  for _ in range(600):
    values = {f: (_value(rng) if rng.random() < 0.7 else None) for f in fields}
    values['port_range'] = values['port_range'] or '20000-32000'
    args = argparse.Namespace(requeue=rng.random() < 0.5, learner_cpus=1, actor_nodes=2,
                              actor_tasks=0, actor_cpus=1, job_name=None, logdir=None,
                              seeds=None, sbatch_arg=[f'--{_value(rng)}'], **values)
    forward = ['catch', 'vtrace', '2', '--game', _value(rng), '--env_config', _value(rng)]
    logdir, name = '/' + _value(rng), _value(rng)
    everything = [*values.values(), *args.sbatch_arg, *forward, logdir, name]
    bad = [v for v in everything if v and re.search(f'[{_CONTROLS}]', v)]
    if bad:
      with pytest.raises(ValueError, match='control character'):
        slurm.batch_script(args, forward, logdir, 3, name)
      refused += 1
      continue
    written += 1
    lines = slurm.batch_script(args, forward, logdir, 3, name).split('\n')
    assert lines[0] == '#!/bin/bash' and lines[-1] == ''
    options = []
    for line in lines[1:-1]:
      if line.startswith('#SBATCH '):
        if line != '#SBATCH hetjob':
          [option] = shlex.split(line[len('#SBATCH '):])  # exactly one word
          options.append(option)
      elif line.startswith('exec '):
        argv = shlex.split(line)[1:]
        assert argv[argv.index('--') + 1:] == forward
        assert argv[argv.index('--logdir') + 1] == logdir
      else:
        assert line.startswith('# ') or line == f'cd {shlex.quote(slurm.REPO_ROOT)}', line
    assert f'--job-name={name}' in options
    for flag in ('account', 'time'):
      if values[flag]:
        assert options.count(f'--{flag}={values[flag]}') == 2  # both components
    assert options.count(args.sbatch_arg[0]) == 2
    assert sum(line.startswith('exec ') for line in lines) == 1
    assert len(lines) == 7 + len(options) + 1  # a fixed shape: nothing added
  assert refused > 50 and written > 50, (refused, written)


# ---- Issue 62, item 1: a task's temp dir on a node others use ----------------------

def _as_other(script: str):
  import subprocess
  return subprocess.run(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups',
                         'sh', '-c', script], capture_output=True, text=True, timeout=30,
                        check=False)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason='makes a node /tmp of root')


@pytest.fixture
def node_tmp():
  """A node's /tmp: root's, world-writable, sticky (without '_', as a task needs)."""
  import shutil
  import tempfile
  path = tempfile.mkdtemp(prefix='seedacmenode', dir='/tmp')
  while '_' in path:
    os.rmdir(path)
    path = tempfile.mkdtemp(prefix='seedacmenode', dir='/tmp')
  os.chmod(path, 0o1777)
  yield path
  shutil.rmtree(path, ignore_errors=True)


@pytest.mark.needs_other_uid  # plants as uid 65534 (setpriv, chown)
def test_a_task_dir_is_new_and_private_whatever_another_uid_planted(node_tmp):
  """Issue 62's attack: uid 65534 plants the task's old predictable dir with a `pid`
  symlink to a file of ours. The task makes a new 0700 dir of its own instead (no '_'),
  writes its pid there, and the file stays as it was."""
  victim = os.path.join(node_tmp, 'victim')
  with open(victim, 'w') as f:
    f.write('precious')
  old = os.path.join(node_tmp, f'{slurm.TASK_TMP_PREFIX}42-1-0')
  planted = _as_other(f'mkdir -m 777 {old} && ln -s {victim} {old}/pid && '
                      f'ln -s {victim} {old}-x')
  assert planted.returncode == 0, planted.stderr
  tmp = slurm.make_task_dir({'TMPDIR': node_tmp}, '42', 1, 0)
  assert os.path.dirname(tmp) == node_tmp and tmp not in (old, f'{old}-x')
  assert os.path.basename(tmp).startswith(f'{slurm.TASK_TMP_PREFIX}42-1-0-')
  assert '_' not in tmp
  st = os.lstat(tmp)
  assert st.st_uid == os.geteuid() and st.st_mode & 0o7777 == 0o700
  with open(os.path.join(tmp, 'pid')) as f:
    assert f.read() == str(os.getpid())
  with open(victim) as f:
    assert f.read() == 'precious'
  tried = _as_other(f'touch {tmp}/x 2>/dev/null && echo WROTE; '
                    f'ln -s {victim} {tmp}/y 2>/dev/null && echo LINKED; echo TRIED')
  assert tried.stdout.split() == ['TRIED'], tried.stdout
  assert os.path.isdir(old) and os.path.islink(f'{old}-x')  # not ours: left alone


@needs_root
def test_the_task_base_is_tmpdir_only_when_no_one_else_can_replace_what_is_made_there(
    node_tmp, tmp_path):
  ours = os.path.join(node_tmp, 'mine')
  os.mkdir(ours, 0o700)
  assert slurm.task_temp_base({'TMPDIR': ours}) == (ours, [])
  assert slurm.task_temp_base({}) == ('/tmp', [])
  assert slurm.task_temp_base({'TMPDIR': node_tmp}) == (node_tmp, [])  # root's, sticky
  shared = os.path.join(node_tmp, 'project')  # others write there, no sticky bit
  os.mkdir(shared)
  os.chmod(shared, 0o777)
  base, passed = slurm.task_temp_base({'TMPDIR': shared})
  assert base == '/tmp' and 'without the sticky bit' in passed[0]
  notes = []
  tmp = slurm.make_task_dir({'TMPDIR': shared}, '7', 0, 0, note=notes.append)
  try:
    assert os.path.dirname(tmp) == '/tmp' and shared in notes[0]
  finally:
    os.remove(os.path.join(tmp, 'pid'))
    os.rmdir(tmp)
  underscore = os.path.join(node_tmp, 'a_b')
  os.mkdir(underscore, 0o700)
  base, passed = slurm.task_temp_base({'TMPDIR': underscore})
  assert base == '/tmp' and 'contains "_"' in passed[0]


@pytest.mark.needs_other_uid  # plants as uid 65534 (setpriv, chown)
def test_stale_task_dirs_of_others_and_links_are_never_removed(node_tmp):
  """The sweep removes only this user's real dirs: not another uid's (named like ours,
  its pid dead), not a symlink named like ours (to a dir of ours with a dead pid)."""
  def task_dir(name, pid, uid=None):
    path = os.path.join(node_tmp, f'{slurm.TASK_TMP_PREFIX}{name}')
    os.mkdir(path, 0o700)
    with open(os.path.join(path, 'pid'), 'w') as f:
      f.write(str(pid))
    if uid is not None:
      os.chown(os.path.join(path, 'pid'), uid, uid)
      os.chown(path, uid, uid)
    return path
  dead = task_dir('1-0-0-aa', 4_000_001)
  theirs = task_dir('2-0-0-bb', 4_000_001, uid=65534)
  target = os.path.join(node_tmp, 'kept')
  os.mkdir(target)
  with open(os.path.join(target, 'pid'), 'w') as f:
    f.write('4000001')
  link = os.path.join(node_tmp, f'{slurm.TASK_TMP_PREFIX}3-0-0-cc')
  os.symlink(target, link)
  removed = slurm.remove_stale_task_dirs(node_tmp, alive=lambda pid: False)
  assert removed == [dead]
  assert os.path.isdir(theirs) and os.path.islink(link) and os.path.isdir(target)
