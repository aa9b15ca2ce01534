"""`launchers/accelerator_check`: does TensorFlow use this machine's GPU/TPU, and how fast.

    scripts/accelerator_check                # sets up .venv, then this module
    scripts/accelerator_check --install_gpu  # also installs requirements/vertex_gpu.txt
    python -m seedacme.launchers.accelerator_check [--quick] [--publish]

One command for whoever has an accelerator. It loads the pip-installed CUDA 11 /
cuDNN 8 libraries (`seedacme.runtime.cuda_libs`, before TensorFlow is imported, as the
central node does) and lists the devices TensorFlow sees. Without a GPU or TPU it
prints one line saying so -- the devices and what it found of the CUDA libraries --
and exits with 1. With one, for every registered agent on CartPole's spec, and for
V-trace and PPO on Atari's (the Nature CNN: where an accelerator matters), it builds
the networks on the device and times

* inference: the compiled batch step (`TFServerPolicy.step`, what the inference server
  calls) per batch size, the median of `--calls` calls after the bucket is compiled;
* learning: the agent's learner step (`train_on`) on a synthetic batch of its replay
  items (`item_signature`) at the agent's registry batch size (`--learner_batch_size`:
  another, the same for every agent), median of a few steps,

and checks that it really ran there: the policy step's outputs and every variable the
learner trains or keeps (optimizer slots included) must be on the device (TensorFlow
falls back to the CPU silently, op by op). The tables go to stdout and to
`<out_dir>/accelerator_check_<device>.json` (default `bench/results/`; `--publish`
copies it to `bench/published/`). Exit code 0: every step ran on the device; 1: no
accelerator, a step failed, or something ran elsewhere.

`--allow_cpu` (for tests) takes the CPU as the "accelerator" so the whole path runs on a
machine without one.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import time
import types
import warnings
from typing import Any, Callable, Dict, List, Sequence, Tuple

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme.runtime import cuda_libs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO_ROOT, 'bench', 'results')
PUBLISHED = os.path.join(REPO_ROOT, 'bench', 'published')
BATCH_SIZES = (1, 8, 32, 128, 256)
QUICK_BATCH_SIZES = (1, 32)
CHEAP_ENV = 'cartpole'  # every agent has registry defaults for it
ATARI_AGENTS = ('vtrace', 'ppo')  # Nature CNN on 84x84x4 frames: an accelerator's job


@dataclasses.dataclass(frozen=True)
class Case:
  """One agent on one env spec, with the registry's defaults for `env`."""
  agent: str
  env: str
  spec: Any  # EnvSpec

  @property
  def name(self) -> str:
    return f'{self.agent}/{self.env}'


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog='launchers/accelerator_check',
                              description=__doc__.split('\n')[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument('--quick', action='store_true',
                 help=f'batch sizes {QUICK_BATCH_SIZES}, 5 timed calls, 2 learner steps')
  p.add_argument('--batch_sizes', default=None,
                 help=f'inference batch sizes, comma-separated (default {BATCH_SIZES})')
  p.add_argument('--calls', type=int, default=None,
                 help='timed inference calls per batch size (default 20; --quick 5)')
  p.add_argument('--learner_steps', type=int, default=None,
                 help='timed learner steps per agent (default 5; --quick 2)')
  p.add_argument('--learner_batch_size', type=int, default=None,
                 help="every learner's batch size (default: each agent's registry batch "
                      'size); a small one checks the path in a fraction of the time')
  p.add_argument('--agents', default=None,
                 help='comma-separated agents (default: every registered agent)')
  p.add_argument('--out_dir', default=RESULTS, help='where the JSON goes')
  p.add_argument('--publish', action='store_true',
                 help='also copy the JSON to bench/published/')
  p.add_argument('--allow_cpu', action='store_true', help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.batch_sizes:
    args.batch_sizes = tuple(int(b) for b in args.batch_sizes.split(','))
  else:
    args.batch_sizes = QUICK_BATCH_SIZES if args.quick else BATCH_SIZES
  if args.calls is None:
    args.calls = 5 if args.quick else 20
  if args.learner_steps is None:
    args.learner_steps = 2 if args.quick else 5
  if min(args.batch_sizes) < 1 or args.calls < 1 or args.learner_steps < 1 or (
      args.learner_batch_size is not None and args.learner_batch_size < 1):
    p.error('batch sizes, --calls, --learner_steps and --learner_batch_size must be >= 1')
  return args


# ---- Devices --------------------------------------------------------------------------

def _short(name: str) -> str:
  """'/physical_device:GPU:0', '/device:GPU:0' -> 'GPU:0'."""
  return name.split('device:')[-1]


def list_devices() -> Dict[str, Any]:
  """The devices TensorFlow sees: physical (with GPU details) and logical."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  physical = []
  for d in tf.config.list_physical_devices():
    entry = {'name': _short(d.name), 'type': d.device_type}
    if d.device_type == 'GPU':
      try:
        details = tf.config.experimental.get_device_details(d)
        entry.update({k: list(v) if isinstance(v, tuple) else v for k, v in details.items()})
      except Exception:  # pylint: disable=broad-except  (details are best-effort)
        pass
    physical.append(entry)
  logical = [_short(d.name) for d in tf.config.list_logical_devices()]
  return {'physical': physical, 'logical': logical}


def accelerator(devices: Dict[str, Any]) -> str | None:
  """The first TPU, else the first GPU, TensorFlow sees ('TPU:0', 'GPU:0'), or None
  (the order `TFServerPolicy` picks its inference device in)."""
  for kind in ('TPU', 'GPU'):
    found = [n for n in devices['logical'] if n.startswith(f'{kind}:')]
    if found:
      return found[0]
  return None


def _driver_loadable() -> bool:
  import ctypes  # pylint: disable=g-import-not-at-top
  for path in (cuda_libs.DRIVER_LIBRARY,) + tuple(
      os.path.join(d, cuda_libs.DRIVER_LIBRARY) for d in cuda_libs.DRIVER_DIRS):
    try:
      ctypes.CDLL(path)
      return True
    except OSError:
      continue
  return False


def cuda_status(loaded: Sequence[str]) -> str:
  """What this process has of the CUDA libraries, in a few words."""
  wanted = len(cuda_libs.CUDA_LIBRARIES)
  found = cuda_libs.find_libraries()
  if not found:
    wheels = ('none of the nvidia-*-cu11 wheels installed (scripts/accelerator_check '
              '--install_gpu)')
  else:
    where = os.path.dirname(os.path.dirname(os.path.dirname(next(iter(found.values())))))
    wheels = f'{len(found)} of {wanted} found, {len(loaded)} loaded from {where}'
    missing = [s for _, s in cuda_libs.CUDA_LIBRARIES if s not in found]
    if missing:
      wheels += f' (missing {", ".join(missing)})'
  driver = 'loadable' if _driver_loadable() else 'not found'
  return f'{wheels}; driver {cuda_libs.DRIVER_LIBRARY} {driver}'


def no_accelerator_line(devices: Dict[str, Any], cuda: str) -> str:
  names = ', '.join(devices['logical']) or 'none'
  return (f'accelerator_check: no GPU or TPU visible to TensorFlow (devices: {names}); '
          f'CUDA libraries: {cuda}')


def _on(device_kind: str, tensor_device: str) -> bool:
  return f'device:{device_kind}:' in tensor_device or tensor_device.startswith(
      f'/{device_kind}:')


# ---- Cases, batches, learners ---------------------------------------------------------

def cases(agents: Sequence[str]) -> List[Case]:
  """CartPole's spec for every agent that serves discrete actions (a HalfCheetah-shaped
  continuous spec for the others, SAC); Atari's Nature CNN for V-trace and PPO."""
  from seedacme import envs  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  cheap = envs.env_spec_of(envs.make_factory(CHEAP_ENV)(0))
  continuous = envs.EnvSpec((17,), 'float32', 0, (6,), (-1.0,) * 6, (1.0,) * 6)
  atari = envs.EnvSpec((84, 84, 4), 'uint8', 6)
  out = []
  for a in agents:
    try:
      registry.make_builder(a, CHEAP_ENV).check_spec(cheap)
      out.append(Case(a, CHEAP_ENV, cheap))
    except ValueError:  # continuous actions only
      out.append(Case(a, 'mujoco', continuous))
  out += [Case(a, 'atari', atari) for a in agents if a in ATARI_AGENTS]
  return out


def synthetic_batch(signature: Any, batch_size: int, num_actions: int, seed: int = 0):
  """A batch of `batch_size` replay items of `signature`: whole episodes' middles
  (FIRST then MID steps), random observations, actions and logits, zero states."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.types import FIRST, MID  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)

  def fill(name: str, spec) -> Any:
    shape = (batch_size,) + tuple(spec.shape)
    dtype = spec.dtype.as_numpy_dtype
    if name == 'step_type':
      x = np.full(shape, MID, dtype)
      x[:, 0] = FIRST
    elif name == 'discount':
      x = np.ones(shape, dtype)
    elif name == 'action' and spec.dtype.is_integer:
      x = rng.integers(0, max(num_actions, 1), shape).astype(dtype)
    elif name == 'observation' and spec.dtype == tf.uint8:
      x = rng.integers(0, 256, shape).astype(dtype)
    elif name in ('initial_state', 'policy_version') or spec.dtype.is_integer:
      x = np.zeros(shape, dtype)
    else:  # reward, logits, observations, log-probabilities, values
      x = (0.1 * rng.normal(size=shape)).astype(dtype)
    return tf.constant(x)

  return {k: tf.nest.map_structure(lambda s, k=k: fill(k, s), v)
          for k, v in signature.items()}


def _vtrace_learner(builder, networks, signature, spec=None):
  from seedacme.agents.vtrace.learning import VTraceLearner  # pylint: disable=g-import-not-at-top
  learner = VTraceLearner(networks, builder.config, None, item_signature=signature)
  return learner, learner.train_on


def _ppo_learner(builder, networks, signature, spec=None):
  from seedacme.agents.ppo.learning import PPOLearner  # pylint: disable=g-import-not-at-top
  learner = PPOLearner(networks, builder.config, None, item_signature=signature)
  return learner, learner.train_on


def _r2d2_learner(builder, networks, signature, spec=None):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.agents.r2d2.learning import R2D2Learner  # pylint: disable=g-import-not-at-top
  c = builder.config
  # No Reverb: no priorities written back. Uniform sampling probabilities from a full
  # table give every sequence importance weight 1.
  learner = R2D2Learner(networks.online, networks.target, c, None, item_signature=signature)
  info = types.SimpleNamespace(probability=tf.fill([c.batch_size], 1.0 / c.replay_size),
                               table_size=tf.constant(c.replay_size, tf.int64), key=None)
  return learner, lambda batch: learner.train_on(info, batch)


def _sac_learner(builder, networks, signature, spec):
  from seedacme.agents.sac.learning import SACLearner  # pylint: disable=g-import-not-at-top
  learner = SACLearner(networks, builder.config, None, item_signature=signature,
                       layout=builder.layout(spec))

  def train(batch):
    metrics = learner.train_on(batch)
    return {'loss': metrics['critic_loss'] + metrics['actor_loss'], **metrics}
  return learner, train


# agent -> (builder, networks, item signature, env spec) -> (learner, train(batch) -> metrics)
LEARNERS: Dict[str, Callable[..., Tuple[Any, Callable[[Any], Dict[str, float]]]]] = {
    'vtrace': _vtrace_learner,
    'ppo': _ppo_learner,
    'r2d2': _r2d2_learner,
    'sac': _sac_learner,
}


def _transitions_per_item(config) -> int:
  """Steps a learner trains on per item (V-trace/PPO: the unroll; R2D2: the trace)."""
  return (getattr(config, 'unroll_length', None) or getattr(config, 'trace_length', None)
          or 1)  # SAC: one transition per item


def _variables(learner) -> List[Any]:
  """Every variable the learner trains or keeps (networks, optimizer, counters)."""
  out = []
  for value in learner.checkpoint_state().values():
    out += list(getattr(value, 'variables', None) or [value])
  return [v for v in out if hasattr(v, 'device')]


# ---- Timing ---------------------------------------------------------------------------

def _median_ms(fn: Callable[[], Any], calls: int) -> float:
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1000 * statistics.median(times)


def time_inference(case: Case, builder, networks, device: str, batch_sizes: Sequence[int],
                   calls: int) -> List[Dict[str, Any]]:
  """One row per batch size: the compiled policy step's median time per batch."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  num_envs = max(batch_sizes)
  spec = case.spec
  rng = np.random.default_rng(0)
  with tf.device(device):
    policy = builder.make_policy(networks, spec, num_envs, num_envs)
  kind = device.split(':')[0]
  rows = []
  for b in batch_sizes:
    ids = np.arange(b, dtype=np.int32)
    shape = (b,) + tuple(spec.observation_shape)
    if np.dtype(spec.dtype) == np.uint8:
      obs = rng.integers(0, 256, shape).astype(np.uint8)
    else:
      obs = rng.normal(size=shape).astype(spec.dtype)
    no = np.zeros(b, bool)
    with tf.device(device):
      start = time.perf_counter()
      policy.warm_up([b])
      compile_s = time.perf_counter() - start
      policy.step(ids, obs, np.ones(b, bool), no)  # the first call after compiling
      ms = _median_ms(lambda ids=ids, obs=obs, no=no: policy.step(ids, obs, no, no), calls)
      # Where the step's outputs live (policy.step hands back numpy copies).
      bucket = policy._bucket(b)  # pylint: disable=protected-access
      outputs = policy._call_for(bucket)(  # pylint: disable=protected-access
          np.arange(bucket, dtype=np.int32), np.resize(obs, (bucket,) + shape[1:]),
          np.zeros(bucket, bool), np.zeros(bucket, bool))
    output_devices = sorted({o.device for o in outputs})
    rows.append({'agent': case.agent, 'env': case.env, 'batch': b, 'ms': ms,
                 'steps_per_s': 1000 * b / ms, 'compile_s': compile_s,
                 'on_device': all(_on(kind, d) for d in output_devices),
                 'output_devices': output_devices})
  return rows


def time_learner(case: Case, builder, networks, device: str, steps: int) -> Dict[str, Any]:
  """The agent's learner step on a synthetic batch: median time of `steps` steps after
  one untimed step (which traces it)."""
  import math  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  config = builder.config
  signature = builder.item_signature(case.spec)
  kind = device.split(':')[0]
  with tf.device(device):
    learner, train = LEARNERS[case.agent](builder, networks, signature, case.spec)
    batch = synthetic_batch(signature, config.batch_size, case.spec.num_actions)
    start = time.perf_counter()
    metrics = train(batch)
    first_s = time.perf_counter() - start
    ms = _median_ms(lambda: train(batch), steps)
  variable_devices = sorted({v.device for v in _variables(learner)})
  transitions = config.batch_size * _transitions_per_item(config)
  loss = metrics.get('loss', float('nan'))
  return {'agent': case.agent, 'env': case.env, 'batch': config.batch_size,
          'transitions': transitions, 'ms': ms, 'transitions_per_s': 1000 * transitions / ms,
          'first_step_s': first_s, 'loss_finite': math.isfinite(loss),
          'on_device': all(_on(kind, d) for d in variable_devices),
          'variable_devices': variable_devices}


# ---- Output ---------------------------------------------------------------------------

def _fmt(v: Any) -> str:
  if isinstance(v, bool):
    return 'yes' if v else 'NO'
  if isinstance(v, float):
    return f'{v:,.0f}' if abs(v) >= 100 else f'{v:.2f}'
  return str(v)


def format_table(rows: List[Dict[str, Any]], columns: Sequence[Tuple[str, str]]) -> str:
  """Fixed-width table; `columns` are (key, heading)."""
  cells = [[_fmt(r.get(k, '-')) for k, _ in columns] for r in rows]
  widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
  lines = ['  '.join(h.rjust(w) for (_, h), w in zip(columns, widths))]
  lines += ['  '.join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
  return '\n'.join(lines)


INFERENCE_COLUMNS = (('agent', 'agent'), ('env', 'env'), ('batch', 'batch'),
                     ('ms', 'ms/batch'), ('steps_per_s', 'env steps/s'),
                     ('compile_s', 'compile s'), ('on_device', 'on device'))
LEARNER_COLUMNS = (('agent', 'agent'), ('env', 'env'), ('batch', 'batch'),
                   ('transitions', 'transitions'), ('ms', 'ms/step'),
                   ('transitions_per_s', 'transitions/s'), ('first_step_s', 'trace s'),
                   ('on_device', 'on device'))


def _harness():
  """bench/harness.py (from the checkout), or None where there is no bench/."""
  path = os.path.join(REPO_ROOT, 'bench', 'harness.py')
  if not os.path.isfile(path):
    return None
  spec = importlib.util.spec_from_file_location('seedacme_bench_harness', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def machine() -> Dict[str, Any]:
  harness = _harness()
  if harness is not None:
    return harness.machine()
  import platform  # pylint: disable=g-import-not-at-top
  return {'cpu': platform.processor() or 'unknown', 'cores': os.cpu_count(),
          'python': platform.python_version(), 'date': time.strftime('%Y-%m-%d %H:%M')}


def device_slug(device: str, devices: Dict[str, Any]) -> str:
  """'gpu_tesla_v100_sxm2_16gb', 'tpu', 'cpu': the JSON's name."""
  kind = device.split(':')[0]
  model = next((d.get('device_name') for d in devices['physical']
                if d['type'] == kind and d.get('device_name')), None)
  name = f'{kind}_{model}' if model else kind
  return re.sub(r'[^a-z0-9]+', '_', name.lower()).strip('_')


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  loaded = cuda_libs.preload()  # before TensorFlow's import, as the central node does
  # TF's import reaches google.api_core, which warns about Python 3.10 (the Python
  # Launchpad needs): noise on the one line a machine without an accelerator gets.
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', category=FutureWarning, module=r'google\.api_core')
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from seedacme.agents import registry  # pylint: disable=g-import-not-at-top
  devices = list_devices()
  cuda = cuda_status(loaded)
  device = accelerator(devices)
  if device is None:
    if not args.allow_cpu:
      print(no_accelerator_line(devices, cuda), file=sys.stderr)
      return 1
    device = 'CPU:0'
  print(f'accelerator_check: TensorFlow {tf.__version__}; physical devices: '
        f'{", ".join(d["name"] for d in devices["physical"])}; logical: '
        f'{", ".join(devices["logical"])}')
  for d in devices['physical']:
    if d['type'] != 'CPU':
      print(f'  {d["name"]}: ' + ', '.join(f'{k}={v}' for k, v in d.items()
                                           if k not in ('name', 'type')))
  print(f'  CUDA libraries: {cuda}')
  print(f'  timing on {device}' + (' (--allow_cpu: no accelerator)'
                                   if device.startswith('CPU') else ''))
  agents = args.agents.split(',') if args.agents else list(registry.agent_names())
  unknown = [a for a in agents if a not in registry.agent_names()]
  if unknown:
    print(f'accelerator_check: unknown agents {unknown}; known: '
          f'{", ".join(registry.agent_names())}', file=sys.stderr)
    return 2
  inference, learners, errors = [], [], []
  overrides = ({} if args.learner_batch_size is None
               else {'batch_size': args.learner_batch_size})
  for case in cases(agents):
    if case.agent not in LEARNERS:
      errors.append(f'{case.name}: no learner recipe in accelerator_check.LEARNERS')
      continue
    started = time.perf_counter()
    try:
      builder = registry.make_builder(case.agent, case.env, **overrides)
      if getattr(builder.config, 'sgd_steps_per_sample', 1) != 1:
        # One gradient step per timed call (SAC's MuJoCo default fuses 4 per sample).
        builder = registry.make_builder(case.agent, case.env, sgd_steps_per_sample=1,
                                        **overrides)
      with tf.device(device):
        networks = builder.make_networks(case.spec)
      inference += time_inference(case, builder, networks, device, args.batch_sizes,
                                  args.calls)
      learners.append(time_learner(case, builder, networks, device, args.learner_steps))
    except Exception as e:  # pylint: disable=broad-except  (report it, go on)
      errors.append(f'{case.name}: {type(e).__name__}: {str(e)[:500]}')
      print(f'accelerator_check: {errors[-1]}', file=sys.stderr)
      continue
    print(f'  {case.name}: done in {time.perf_counter() - started:.1f}s', flush=True)
  off_device = sorted({f'{r["agent"]}/{r["env"]}' for r in inference + learners
                       if not r['on_device']})
  print(f'\nInference: the compiled batch step (TFServerPolicy.step), median of '
        f'{args.calls} calls, on {device}')
  print(format_table(inference, INFERENCE_COLUMNS))
  print(f'\nLearner: one train_on step on a synthetic batch, median of '
        f'{args.learner_steps} steps, on {device}')
  print(format_table(learners, LEARNER_COLUMNS))
  os.makedirs(args.out_dir, exist_ok=True)
  path = os.path.join(args.out_dir, f'accelerator_check_{device_slug(device, devices)}.json')
  build = dict(tf.sysconfig.get_build_info())
  with open(path, 'w') as f:
    json.dump({'machine': machine(), 'tensorflow': tf.__version__,
               'tf_build': {k: build.get(k) for k in ('cuda_version', 'cudnn_version',
                                                     'is_cuda_build')},
               'device': device, 'allow_cpu': device.startswith('CPU'), 'devices': devices,
               'cuda_libraries': cuda, 'cuda_loaded': list(loaded),
               'xla_flags': os.environ.get('XLA_FLAGS', ''),
               'calls': args.calls, 'learner_steps': args.learner_steps,
               'learner_batch_size': args.learner_batch_size,
               'inference': inference, 'learner': learners, 'errors': errors,
               'off_device': off_device}, f, indent=1)
  print(f'\nwrote {path}')
  if args.publish:
    os.makedirs(PUBLISHED, exist_ok=True)
    published = shutil.copy(path, PUBLISHED)
    print(f'published {published}')
  if off_device:
    print(f'accelerator_check: ran (partly) off {device}: {", ".join(off_device)}',
          file=sys.stderr)
  return 1 if errors or off_device else 0


if __name__ == '__main__':
  sys.exit(main())
