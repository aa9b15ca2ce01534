"""The launchers' plans: Vertex AI's dry run (a valid job plan without xmanager or
credentials), the executables Launchpad builds for it, and the own-machines launcher's
dry run (which replica starts where, checked against the cluster spec)."""

import json
import os
import shutil
import stat
import tempfile

import pytest

from seedacme.agents import registry
from seedacme.launchers import cluster, emulation, vertex
from seedacme.launchers.program_flags import make_program_inputs
from tests.integration import launch


def _dry_run_json(capsys, *args):
  code = vertex.main([*args, '--dry_run', '--json'])
  out = json.loads(capsys.readouterr().out)
  return code, out


def test_atari_vtrace_64_actors_gpu_learner(capsys):
  code, plan = _dry_run_json(capsys, 'atari', 'vtrace', '64', '--accelerator', 'V100')
  assert code == 0 and plan['valid'] and plan['errors'] == []
  pools = plan['worker_pools']
  assert len(pools) <= 4 and pools[0]['replicas'] == 1
  by_group = {g: p for p in pools for g in p['groups']}
  assert by_group['learner']['hardware']['accelerator'] == 'V100'
  assert by_group['learner']['replicas'] == 1 and by_group['learner']['groups'] == {'learner': 1}
  assert by_group['actor']['groups']['actor'] == 64
  assert by_group['actor']['hardware']['accelerator'] is None
  assert sum(p['replicas'] for p in pools) == 64 + 3  # actors + learner, replay, evaluator
  assert all(p['image'] == 'python:3.10' for p in pools)
  # Only the GPU's pool adds the CUDA 11 / cuDNN 8 wheels to the lock.
  assert by_group['learner']['requirements'] == [vertex.LOCK, vertex.GPU_REQUIREMENTS]
  assert all(p['requirements'] == [vertex.LOCK] for p in pools if 'learner' not in p['groups'])
  # The replay pool is sized for the agent's queue of 21 x 84x84x4-frame unrolls
  # (~0.3 GiB at 256 unrolls, x2, rounded down) + 4 GiB slack.
  assert by_group['replay']['hardware']['memory_gb'] == 4


def test_replay_memory_follows_the_agents_replay_capacity():
  spec = vertex.envs.EnvSpec((84, 84, 4), 'uint8', 6)
  # 10k unrolls of 21 steps: 2 x 10k x (21 x (28224 + 64) + 4096) bytes = 11.1 GiB, + 4.
  vtrace = registry.make_builder('vtrace', 'atari', queue_size=10_000)
  assert vertex.replay_memory_gb(vtrace, spec) == 15
  # 25k sequences of 31 steps (R2D2's Atari default): 2 x 25k x (31 x 28288 + 4096)
  # bytes = 41.0 GiB, + 4.
  r2d2 = registry.make_builder('r2d2', 'atari')
  assert r2d2.replay_capacity() == (25_000, 31)
  assert vertex.replay_memory_gb(r2d2, spec) == 45


def test_printed_plan_is_readable(capsys):
  assert vertex.main(['catch', 'r2d2', '8', '--accelerator', 'T4', '--dry_run']) == 0
  out = capsys.readouterr().out
  assert 'workerpool0' in out and '1 x T4' in out and 'plan is valid' in out


def test_plan_rules_catch_bad_layouts(tmp_path):
  reqs = str(tmp_path / 'requirements.txt')
  open(reqs, 'w').close()
  (tmp_path / 'setup.py').write_text('')
  code = str(tmp_path)
  groups = {'replay': 1, 'counter': 1, 'learner': 1, 'actor': 4, 'evaluator': 1}
  hw = {g: vertex.Hardware(4 + i, 8) for i, g in enumerate(groups)}  # five distinct types
  errors = vertex.validate_plan(vertex.plan_worker_pools(groups, hw, reqs, code))
  assert any('at most 4' in e for e in errors)

  gpu = vertex.Hardware(8, 32, 'V100', 1)
  shared = {'replay': vertex.Hardware(4, 8), 'counter': gpu, 'learner': gpu,
            'actor': vertex.Hardware(4, 8), 'evaluator': vertex.Hardware(4, 8)}
  errors = vertex.validate_plan(vertex.plan_worker_pools(groups, shared, reqs, code))
  assert any('only the central inference/learner node' in e for e in errors)

  missing = vertex.validate_plan(vertex.plan_worker_pools(
      groups, shared, str(tmp_path / 'nope.txt'), code))
  assert any('does not exist' in e for e in missing)


def test_first_pool_always_gets_exactly_one_replica(tmp_path):
  # Even when no group has a single node, Launchpad splits one node off the first pool.
  reqs = str(tmp_path / 'r.txt')
  open(reqs, 'w').close()
  same = vertex.Hardware(4, 8)
  pools = vertex.plan_worker_pools({'actor': 3, 'evaluator': 2}, {'actor': same,
                                                                  'evaluator': same},
                                   reqs, str(tmp_path))
  assert pools[0].replicas == 1 and sum(p.replicas for p in pools) == 5


@pytest.mark.parametrize('accelerator', ['none', 'TPU_V3'])
def test_accelerator_choices(capsys, accelerator):
  args = ['catch', 'vtrace', '2', '--accelerator', accelerator]
  if accelerator == 'TPU_V3':
    args += ['--accelerator_count', '8']
  code, plan = _dry_run_json(capsys, *args)
  assert code == 0, plan['errors']
  # No CUDA wheels without a GPU (a TPU's image needs none of them either).
  assert all(p['requirements'] == [vertex.LOCK] for p in plan['worker_pools'])


def test_the_learner_pool_gets_accelerator_count_gpus(capsys):
  code, plan = _dry_run_json(capsys, 'atari', 'vtrace', '8', '--accelerator', 'V100',
                             '--accelerator_count', '2')
  assert code == 0, plan['errors']
  [learner] = [p for p in plan['worker_pools'] if 'learner' in p['groups']]
  assert learner['hardware']['accelerator_count'] == 2
  assert vertex.main(['atari', 'vtrace', '8', '--accelerator', 'V100',
                      '--accelerator_count', '2', '--dry_run']) == 0
  assert '+ 2 x V100' in capsys.readouterr().out


def test_the_gpu_requirements_pin_every_library_tensorflow_loads():
  from seedacme.runtime import cuda_libs  # pylint: disable=g-import-not-at-top
  with open(vertex.GPU_REQUIREMENTS) as f:
    pins = [line.split('==') for line in f if line.strip() and not line.startswith('#')]
  assert all(len(pin) == 2 and pin[0].endswith('-cu11') for pin in pins), pins
  wheels = {name for name, _ in pins}
  needed = {f'nvidia-{d.replace("_", "-")}-cu11' for d, _ in cuda_libs.CUDA_LIBRARIES}
  assert needed | {'nvidia-cuda-nvcc-cu11'} == wheels


@pytest.fixture
def tmpdir_without_underscore(monkeypatch):
  """A temp dir for Launchpad's executables (needs xmanager, like a launch)."""
  if os.environ.get('SEEDACME_REQUIRE_VERTEX') != '1':
    pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')
  # Launchpad draws temp dirs until a path has no '_': the parent must have none either
  # (mkdtemp's random suffix has one about 1 time in 5; then Launchpad loops forever).
  tmp = launch.tmpdir_without_underscore('seedacmetest')
  monkeypatch.setattr(tempfile, 'tempdir', tmp)
  yield tmp
  shutil.rmtree(tmp, ignore_errors=True)


def _program(launcher, argv, logdir, accelerator=None):
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top
  args = launcher.parse_args(argv)
  factory, spec, builder, config = make_program_inputs(args, logdir, accelerator=accelerator)
  return args, program_lib.make_program(builder, factory, spec, config, name='t')


def test_launchpad_builds_the_gpu_pool_with_the_cuda_wheels(tmp_path, tmpdir_without_underscore):
  # The real executables (Launchpad's to_docker_executables), as a launch builds them:
  # the one requirements.txt each image installs.
  args, program = _program(vertex, ['catch', 'vtrace', '2', '4', '--accelerator', 'V100'],
                           str(tmp_path), accelerator='V100')
  hardware = vertex.group_hardware(args, 4)
  pools = vertex.plan_worker_pools({g: len(n) for g, n in program.groups.items()},
                                   hardware, vertex.group_requirements(hardware),
                                   vertex.stage_code_directory())
  built = emulation.build_pools(program, {p.name: p.nodes for p in pools},
                                vertex.xm_resources(pools))
  installs = {}
  for (name, directory, *_), pool in zip(built, pools):
    assert name == pool.name
    with open(os.path.join(directory, 'requirements.txt')) as f:
      installs[tuple(pool.groups())] = f.read()
  assert len(installs) == 3, installs  # replay; learner; actors + evaluator
  for groups, text in installs.items():
    assert 'tensorflow==2.8.4' in text
    assert ('nvidia-cudnn-cu11==' in text) == (groups == ('learner',)), groups


def test_own_machines_get_one_executable_per_node_group(tmp_path, tmpdir_without_underscore):
  _, program = _program(cluster, ['catch', 'vtrace', '2', '4'], str(tmp_path))
  pools = cluster.plan_pools({g: len(n) for g, n in program.groups.items()})
  assert pools == {'replay': ['replay/0'], 'learner': ['learner/0'],
                   'actor': ['actor/0', 'actor/1'], 'evaluator': ['evaluator/0']}
  code = vertex.stage_code_directory()
  built = emulation.build_pools(program, pools, cluster.host_resources(list(pools), code))
  assert [(b.name, b.replicas) for b in built] == [(p, len(n)) for p, n in pools.items()]
  for b in built:
    assert b.command[:3] == ['python', '-m', 'process_entry'], b.command
    assert {'job.pkl', 'process_entry.py', 'seedacme', 'launchers'} <= set(os.listdir(b.directory))


def _cluster_plan(capsys, *args):
  code = cluster.main(['catch', 'vtrace', '2', '8', *args, '--dry_run', '--json'])
  captured = capsys.readouterr()
  return code, (json.loads(captured.out) if code == 0 else captured.err)


def test_cluster_dry_run_lists_every_replica_and_a_spec_to_fill_in(capsys):
  code, plan = _cluster_plan(capsys)
  assert code == 0
  assert [r['replica'] for r in plan['replicas']] == [
      'replay/0', 'learner/0', 'actor/0', 'actor/1', 'evaluator/0']
  assert all(r['starts_here'] and r['address'] is None for r in plan['replicas'])
  assert plan['cluster_spec'] == {'replay': ['HOST:PORT'], 'learner': ['HOST:PORT'],
                                  'actor': ['HOST:PORT'] * 2, 'evaluator': ['HOST:PORT']}
  # Without an evaluator the group is gone from the spec too.
  code, plan = _cluster_plan(capsys, '--num_eval_envs', '0')
  assert code == 0 and 'evaluator' not in plan['cluster_spec']


def test_cluster_dry_run_checks_the_spec_and_this_hosts_replicas(tmp_path, capsys):
  spec = {'replay': ['10.0.0.1:7000'], 'learner': ['10.0.0.1:7001'],
          'actor': ['10.0.0.2:7100', '10.0.0.2:7101'], 'evaluator': ['10.0.0.2:7102']}
  spec_file = tmp_path / 'cluster.json'
  spec_file.write_text(json.dumps(spec))
  code, plan = _cluster_plan(capsys, '--cluster_spec', f'@{spec_file}', '--replicas',
                             'replay/0,learner/0', '--logdir', str(tmp_path / 'run'))
  assert code == 0 and plan['cluster_spec'] == spec and plan['logdir'] == str(tmp_path / 'run')
  assert {r['replica']: (r['address'], r['starts_here']) for r in plan['replicas']} == {
      'replay/0': ('10.0.0.1:7000', True), 'learner/0': ('10.0.0.1:7001', True),
      'actor/0': ('10.0.0.2:7100', False), 'actor/1': ('10.0.0.2:7101', False),
      'evaluator/0': ('10.0.0.2:7102', False)}
  for args, named in (
      (['--cluster_spec', json.dumps({'replay': ['a:1']})], 'addresses per pool'),
      (['--cluster_spec', json.dumps({**spec, 'replay': ['no-port']})], 'not host:port'),
      (['--cluster_spec', f'@{tmp_path / "missing.json"}'], 'cannot read'),
      (['--cluster_spec', '{not json'], 'not JSON'),
      (['--replicas', 'actor/2'], "'actor/2' is not one of replay/0, learner/0, actor/0"),
  ):
    code, err = _cluster_plan(capsys, *args)
    assert code == 2 and named in err, (args, err)


def test_cluster_takes_the_program_flags_of_the_other_launchers(capsys):
  argv = ['catch', 'r2d2', '3', '--agent_config', 'batch_size=8', '--target_return', '0.9',
          '--no-standby_restarts', '--seed', '5']
  _, _, builder, config = make_program_inputs(cluster.parse_args(argv), '/tmp/unused')
  _, _, vertex_builder, vertex_config = make_program_inputs(vertex.parse_args(argv),
                                                            '/tmp/unused')
  assert config == vertex_config and builder.config == vertex_builder.config
  assert (config.envs_per_actor, config.seed, builder.config.batch_size) == (32, 5, 8)
  # A run (not a dry run) needs the addresses and a shared logdir before anything else.
  assert cluster.main(argv) == 2
  assert '--cluster_spec and --logdir required' in capsys.readouterr().err


def test_vertex_emulate_sends_a_cluster_spec_to_the_cluster_launcher(capsys):
  code = vertex.main(['catch', 'vtrace', '2', '--emulate', '--cluster_spec', '{}'])
  assert code == 2
  assert 'python -m seedacme.launchers.cluster' in capsys.readouterr().err


def test_a_real_vertex_job_puts_every_replica_behind_the_guard(tmp_path, capsys, monkeypatch):
  """Issue 64: a real job is authenticated by default. What is submitted (xmanager's
  experiment, recorded here in place of the cloud): every pool's container runs the
  replica guard in front of Launchpad's entrypoint, its code holds the job's manifest
  (no secret), and the store holds the CA and one 0600 leaf per replica slot.
  `--network host` goes to Launchpad's own launch, saying what is exposed."""
  pytest.importorskip('xmanager', reason='needs requirements/vertex.txt (xmanager 0.3.0)')
  from xmanager import xm_local  # pylint: disable=g-import-not-at-top
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  submitted = []

  class Experiment:
    def __enter__(self):
      return self

    def __exit__(self, *_):
      return False

    def package(self, packageables):
      return [p.executable_spec for p in packageables]

    def add(self, group):
      submitted.append(group)

  monkeypatch.setattr(vertex, 'check_cloud_setup', lambda: [])
  monkeypatch.setattr(xm_local, 'create_experiment', lambda **_: Experiment())
  store = tmp_path / 'store'
  assert vertex.main(['catch', 'vtrace', '2', '--accelerator', 'none', '--credentials',
                      str(store)]) == 0
  out = capsys.readouterr().out
  assert f'the job\'s credentials in {store}' in out, out
  [group] = submitted
  jobs = list(group.jobs.values())
  assert len(jobs) == 3  # replay, learner, actors + evaluator
  slots = set()
  for i, job in enumerate(jobs):
    [command] = job.executable.entrypoint.commands
    assert command.startswith('python -m seedacme.wire.replica_guard -- python -m '
                              'process_entry --data_file=job.pkl'), command
    manifest = json.load(open(os.path.join(job.executable.path, 'seedacme-job.json')))
    assert manifest['store'] == str(store) and manifest['central'] == 'workerpool1/0'
    slots.update(f'workerpool{i}-{k}' for k in range(job.executor.requirements.replicas))
  names = sorted(os.listdir(store))
  assert names == sorted(['ca.pem'] + [f'{s}.{f}' for s in slots for f in ('cert.pem',
                                                                         'key.pem')])
  assert {stat.S_IMODE(os.stat(store / n).st_mode) for n in names} == {0o600}

  launched = []
  monkeypatch.setattr(lp, 'launch', lambda program, **kw: launched.append(program))
  assert vertex.main(['catch', 'vtrace', '2', '--accelerator', 'none', '--network',
                      'host']) == 0
  assert 'vertex: --network host: ' in capsys.readouterr().err and len(launched) == 1
