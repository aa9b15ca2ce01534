"""How many env steps/s can one central node serve? A capacity model from measured costs.

    .venv/bin/python bench/capacity.py              # tables; writes bench/results/capacity.json
    .venv/bin/python bench/capacity.py --publish    # also bench/published/capacity.json

Runs nothing: reads bench/published/*.json and the GPU anchors (../shared/anchors/
gpu-h200*.json: the project's Atari nets timed on an H200) and predicts
(docs/capacity.md). Every cost is a dataclass field naming the file and field it came
from (`derive` and `derive_devices` recompute them, a test compares), so a user can
check the arithmetic and put in their own host; the few costs nothing measured say
ASSUMED beside them. A batch of R requests of K envs costs the one server loop R x the
transport's request cost + the compiled step's call + R*K x the forward pass per env,
which an accelerator takes off the host: its time per batch is a measured curve
(`Device`: end to end, frames from host memory to actions back, per device kind and
framework; a TF 2.8 server's host-side call floor, measured here, comes on top). A
learner on the same device takes its measured time per env step from it too. An actor
pays K env steps and its side of a request. Rate = min(CPU bound, pipeline bound,
learner bound). The pipeline is a convoy, as measured here: actors step together while
the server idles, then wait while it serves every queued batch: N*K / (stepping + N/R x
batch time), tending to the server loop's own limit as N grows. Where actors and server
overlap, `ceiling` = min(CPU, server bounds).

Why dataclasses of constants rather than a fit run at import: the model must say where
each number came from and hold still between bench runs; the tests recompute every
constant from its source and fail when a re-run bench moves one.
"""

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from typing import Any, Dict, List, Tuple

BENCH = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = os.path.join(BENCH, 'published')
# The GPU anchors live beside the repository, not in it (measured on a leased H200 with
# PyTorch and JAX, neither of which this project ships); `--publish` copies the files
# into capacity.json so a tree without them (Bazel's runfiles) still holds the figures.
ANCHORS = os.environ.get('SEEDACME_ANCHORS') or os.path.join(
    os.path.dirname(BENCH), '..', 'shared', 'anchors')
ANCHOR_FILES = ('gpu-h200.json', 'gpu-h200-jax.json')
FRAMES_PER_STEP = {'catch': 1, 'pong': 4}  # bench/acting.py reports Pong in frames/s
TOLERANCE = 0.25  # issue 26's acceptance: |predicted / measured - 1| <= 25 %


@dataclasses.dataclass(frozen=True)
class Transport:
  """Per-request costs of a transport, microseconds of CPU on this machine (2 cores)."""
  name: str
  # Server CPU per request besides the policy call (decode, batch, validate, reply): 1e6 /
  # requests_per_s of the service bench's `batcher` rows (no-work policy, one core busy).
  server_req_us: float
  server_req_us_per_env: float
  policy_call_us: float  # the compiled step's call in that server: `seed` - `batcher`
  # Actor CPU per request besides stepping envs (build, send, wait, decode, account):
  # an actor node's cpu_us_per_step at K=1 minus the env (2 cores / ceiling_per_s).
  actor_req_us: float
  batch_fill: float  # requests per batch = max(1, fill * N): `seed` rows' batch_fill, 8 x 1


# inference_service.json catch clients=2 batcher: 278.0 / 289.0 / 273.3 us at K=1/16/64 (no
# trend: the mean); seed - batcher at K=1: 337.8; acting_cpu.json catch 2x1
# central_actor_cpu_us_per_step 364.3 - 20.4; inference_service_shm.json seed courier 8x1.
COURIER = Transport('courier', 280.1, 0.0, 337.8, 343.9, 0.29)
# inference_service_shm.json transport=shm batcher: 8x1 27.6 us, 2x16 64.3 us (a line in
# K); seed - batcher at 2x16, 195.8, minus 16 x Catch's 0.46 us per env; acting_shm.json
# catch 8x1 shm_actor_cpu_us_per_step 101.7 - 17.9 (8 actors on 2 cores: inflated by
# process switches, docs/benchmarks.md); seed shm 8x1 batch_fill.
SHM = Transport('shm', 25.2, 2.45, 188.4, 83.8, 0.51)


@dataclasses.dataclass(frozen=True)
class Device:
  """One accelerator kind and framework running one network, as a SEED server calls it.

  `batch_us`: measured (batch of B envs, microseconds end to end: uint8 frames from host
  memory, copy in, forward, sample, actions copied out), interpolated between the
  measured batches; beyond the largest at its cost per env. A batch never costs more
  per env than a smaller measured one (a server could split it), so more actors never
  make the device slower per env. `learner_us_per_step`: device time of one learner
  step per env step trained ([T=20, B=32] = 640 env steps per step); None: not
  modelled. The framework's own host-side work is inside these times; a TF 2.8 server
  pays its call floor on the host on top (`Host.host_call_us`).
  """
  name: str  # device kind and framework (and which run)
  net: str
  batch_us: Tuple[Tuple[int, float], ...]
  learner_us_per_step: float | None

  def time_us(self, b: float) -> float:
    """Device time of one batch of `b` envs."""
    pts = self.batch_us

    def at(x):
      if x <= pts[0][0]:
        return pts[0][1]
      for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if x <= b1:
          return t0 + (t1 - t0) * (x - b0) / (b1 - b0)
      return pts[-1][1] * x / pts[-1][0]

    return b * min([at(b) / b] + [t / x for x, t in pts if x <= b])


def _line(name: str, net: str, call_us: float, us_per_env: float) -> Device:
  """An ASSUMED device cost, call + B x per env (two points of that line)."""
  return Device(name, net, ((1, call_us + us_per_env), (4096, call_us + 4096 * us_per_env)),
                None)


@dataclasses.dataclass(frozen=True)
class Env:
  """An env with its policy network and learner, CPU microseconds per env step."""
  name: str
  env_us: float  # actor CPU per env step, stepping only
  env_threads: float  # cores an actor's engine keeps busy stepping its K envs
  policy_us_per_env: float  # forward pass per env on the central node's CPU
  net: str  # its network's key in DEVICES (the device costs)
  actor_side_call_us: float  # actor-side inference: actor CPU per call and per env
  actor_side_us_per_env: float
  learner_us: float  # learner CPU per env step when it trains on the host's CPU


# Catch, V-trace MLP 64-64. env: 2e6 / acting.json catch 2x16 ceiling_per_s. forward:
# inference_service.json (seed - batcher) at K=64 minus at K=1, / 63. actor-side:
# acting_cpu.json catch (actor_cpu_us_per_step - env) x K, mean of 2x1/2x16/2x64
# (320/410/365). learner: learner_speed_r2d2.json onednn 2e6 / transitions/s (R2D2's
# LSTM-64 step: the small-net learner measured; the V-trace MLP's alone was not).
CATCH = Env('catch', 14.5, 1.0, 0.46, 'catch_mlp', 365.0, 0.0, 9.8)
# Pong, SEED's IMPALA ResNet torso (as bench/acting.py serves it). env: atari_engines.json
# actor vector_sync 16 envs delay 0 cpu_us_per_env_step; threads: median cores_busy of
# those actor_runs. forward: acting_cpu.json pong 2x16 central_learner_cpu_us_per_step
# 2767.9 - Courier's (280.1 + 337.8) / 16 (that row's own rate check is then in-sample).
# device: the ResNet + LSTM 256 (`impala_lstm`), the network measured on the GPU; the
# acting bench's feed-forward ResNet lacks the LSTM, so a little slower than it would be.
# actor-side: acting_cpu.json pong actor_cpu_us_per_step 2918.5 - env. learner:
# learner_speed.json onednn 2e6 / transitions/s (the Nature CNN's learner on this CPU:
# the ResNet's was not measured on a CPU).
ATARI = Env('atari', 415.0, 1.43, 2729.3, 'impala_lstm', 0.0, 2503.5, 823.5)


# Measured device costs: ../shared/anchors (`derive_devices` recomputes them). serve rows
# (batch, end_to_end_ms x 1000); learn rows T=20 B=32 step_ms x 1000 / 640.
# gpu-h200.json `serve` and `learn` (PyTorch 2.11, cuDNN, TF32; 2026-11-28):
H200_TORCH_1 = {
    'nature_cnn': Device('H200, PyTorch 2.11 (run 1)', 'nature_cnn', (
        (1, 532.5), (8, 563.6), (32, 698.5), (64, 829.8), (128, 1099.1), (256, 1345.0),
        (512, 2513.1), (1024, 4480.2), (2048, 10138.9)), 4.48125),
    'impala_lstm': Device('H200, PyTorch 2.11 (run 1)', 'impala_lstm', (
        (1, 1608.4), (8, 1773.1), (32, 1960.3), (64, 2160.8), (128, 2315.2), (256, 3062.8),
        (512, 5038.8), (1024, 10408.6), (2048, 18637.6)), 27.939063),
}
# gpu-h200.json `second_run_same_day` and `second_run_learn` (same card kind, same day):
H200_TORCH_2 = {
    'nature_cnn': Device('H200, PyTorch 2.11 (run 2)', 'nature_cnn', (
        (1, 455.5), (8, 570.6), (32, 738.9), (64, 887.6), (128, 1121.6), (256, 1726.2),
        (512, 2634.3), (1024, 4729.3), (2048, 8564.4)), 3.671875),
    'impala_lstm': Device('H200, PyTorch 2.11 (run 2)', 'impala_lstm', (
        (1, 1140.6), (8, 1699.4), (32, 1917.8), (64, 2016.4), (128, 1915.0), (256, 2898.8),
        (512, 5415.0), (1024, 9778.7), (2048, 18829.1)), 30.135938),
}
# gpu-h200-jax.json `serve` (JAX 0.11 / XLA, flax; within run 2's lease). Its learner was
# not timed: run 2's PyTorch learner stands in (the slower of the two, said in the table).
H200_JAX = {
    'nature_cnn': Device('H200, JAX 0.11 / XLA', 'nature_cnn', (
        (1, 1286.3), (32, 1273.2), (256, 1644.2), (1024, 5396.6)), 3.671875),
    'impala_lstm': Device('H200, JAX 0.11 / XLA', 'impala_lstm', (
        (1, 1917.3), (32, 1768.0), (256, 2679.9), (1024, 10429.8)), 30.135938),
}
# Catch's MLP on any accelerator: ASSUMED ~0.1 ms per call (kernel launches) + 0.2 us per
# env, its learner's device time not modelled: nothing timed a small MLP on a GPU.
CATCH_DEVICE = _line('any GPU, ASSUMED (not measured)', 'catch_mlp', 100.0, 0.2)
DEVICES = {'h200-torch-1': {**H200_TORCH_1, 'catch_mlp': CATCH_DEVICE},
           'h200-torch-2': {**H200_TORCH_2, 'catch_mlp': CATCH_DEVICE},
           'h200-jax': {**H200_JAX, 'catch_mlp': CATCH_DEVICE}}
FRAMES_PER_LEARNER_STEP = 20 * 32  # the anchors' [T, B] learner batch


@dataclasses.dataclass(frozen=True)
class Host:
  """The central node's machine; the defaults are this one's acting-only runs."""
  name: str
  cores: float
  accelerator: bool = False
  reserved_cores: float = 0.0  # ASSUMED on training hosts: replay, evaluator, learner input
  train: bool = False  # False = bench/acting.py's --acting_only (no learner, no writer)
  actors_on_host: bool = True  # False: actors on other machines, over Courier
  link_rtt_us: float = 0.0  # network round trip to remote actors
  cpu_forward_threads: float = 8.0  # ASSUMED: cores one CPU forward pass can use
  # Host CPU of a call the device runs, on top of the device's measured time: TF 2.8's
  # call floor on this machine, tf_call_floor.json trivial xla us_per_call (the anchors
  # are PyTorch and JAX, whose own host-side work is inside their times).
  host_call_us: float = 105.0
  device: str = 'h200-torch-1'  # the measured device costs (DEVICES) of its accelerator
  devices: int = 1  # accelerators on the host
  # 0: the learner shares the inference device (its time per env step is added to the
  # device's); > 0: it has that many devices of its own (ASSUMED to scale linearly).
  learner_devices: int = 0
  # A learner sharing the device: True (ASSUMED), its steps fill the device while the
  # actors step (only the device's total time binds); False, they queue with inference
  # batches (the convoy's batch time grows by them: the pessimistic end).
  learner_overlaps: bool = True
  device_slowdown: float = 1.0  # ASSUMED: multiplies the device time (a slower card)


THIS_MACHINE = Host('this machine', 2)


def device_of(env: Env, host: Host) -> Device:
  """The measured (or, for Catch, assumed) device costs of `env`'s net on `host`."""
  return DEVICES[host.device][env.net]


def learner_bound(env: Env, host: Host, devices: float) -> float:
  """Env steps/s a learner on `devices` accelerators of their own trains at most (inf:
  not on a device, or its device time not modelled)."""
  learn = device_of(env, host).learner_us_per_step
  if not (host.train and host.accelerator) or learn is None or devices <= 0:
    return math.inf
  return devices * 1e6 / (learn * host.device_slowdown)


def central(env: Env, tr: Transport, host: Host, n: int, k: int,
            device: bool | None = None, learner_on_device: bool | None = None
            ) -> Dict[str, Any]:
  """Central inference, N actors x K envs: predicted env steps/s and what binds it.

  With an accelerator, inference (`device`) and a training run's learner
  (`learner_on_device`) each run wherever the run is faster: None tries both."""
  if device is None or learner_on_device is None:
    on_device = {False, host.accelerator}
    learner_options = on_device if host.train else {False}
    options = [central(env, tr, host, n, k, d, ld)
               for d in (on_device if device is None else {device})
               for ld in (learner_options if learner_on_device is None
                          else {learner_on_device})]
    return max(options, key=lambda p: (p['rate'], p['ceiling']))  # ties: the higher ceiling
  free, r = host.cores - host.reserved_cores, max(1.0, tr.batch_fill * n)  # r: requests/batch
  b = r * k
  req = r * (tr.server_req_us + tr.server_req_us_per_env * k) + (
      host.host_call_us if device else tr.policy_call_us)
  fwd_cpu = 0.0 if device else b * env.policy_us_per_env
  dev = device_of(env, host)
  # The learner on the inference device (it has no devices of its own): its time per
  # env step goes to that device.
  shared = device and learner_on_device and host.learner_devices == 0
  learn_us = (dev.learner_us_per_step * host.device_slowdown
              if shared and host.train and dev.learner_us_per_step is not None else 0.0)
  infer = dev.time_us(b) * host.device_slowdown if device else 0.0
  learn = 0.0 if host.learner_overlaps else b * learn_us  # serialised with the batches
  fwd = infer + learn if device else fwd_cpu / min(free, host.cpu_forward_threads)
  z_cpu = k * env.env_us + tr.actor_req_us  # an actor's CPU per round
  z_wall = k * env.env_us / env.env_threads + tr.actor_req_us + host.link_rtt_us
  if host.actors_on_host:  # the convoy steps all N actors at once on the free cores
    z_wall = max(z_wall, z_cpu * n / free)
  pipeline = n * k / (z_wall + n / r * (req + fwd)) * 1e6
  per_step = (req + fwd_cpu) / b + (z_cpu / k if host.actors_on_host else 0.0)
  per_step += env.learner_us if host.train and not learner_on_device else 0.0
  cpu, server = free / per_step * 1e6, b / (req + fwd) * 1e6
  if shared and learn_us and host.learner_overlaps:  # the device busy at most 100 %
    learner, learner_name = 1e6 / (infer / b + learn_us), 'device: inference + learner'
  elif learner_on_device and not shared:
    learner = learner_bound(env, host, host.learner_devices or host.devices)
    learner_name = 'learner devices'
  else:
    learner, learner_name = math.inf, ''
  parts = {'actors stepping': z_wall, 'server loop': n / r * req,
           'device' if device else 'cpu forward': n / r * (fwd - learn)}
  if learn:
    parts['device: learner'] = n / r * learn
  rate = min(cpu, pipeline, learner)
  bound = (learner_name if learner <= min(cpu, pipeline) else
           'cpu' if cpu <= pipeline else max(parts, key=parts.get))
  return {'rate': rate, 'ceiling': min(cpu, server, learner), 'cpu_bound': cpu,
          'pipeline_bound': pipeline, 'server_bound': server, 'learner_bound': learner,
          'device': device, 'learner_on_device': learner_on_device, 'bound': bound,
          'batch_envs': b, 'cpu_us_per_step': per_step}


def actor_side(env: Env, host: Host, n: int, k: int) -> float:
  """Actor-side inference (every actor its own network copy): env steps/s. A training
  run's learner uses all of the host's accelerators (`learner_bound`) or its CPU,
  whichever is faster."""
  one = k / (k * env.env_us / env.env_threads + env.actor_side_call_us
             + k * env.actor_side_us_per_env)  # one actor with a core of its own
  rates = []
  for on_device in {False, host.accelerator and host.train}:
    per_step = env.env_us + env.actor_side_call_us / k + env.actor_side_us_per_env
    per_step += env.learner_us if host.train and not on_device else 0.0
    learner = learner_bound(env, host, host.devices) if on_device else math.inf
    rates.append(min((host.cores - host.reserved_cores) / per_step * 1e6, n * one * 1e6,
                     learner))
  return max(rates)


def saturation(env: Env, tr: Transport, host: Host, k: int, max_n: int = 4096):
  """(actors needed, prediction): the fewest actors reaching 95 % of the most."""
  rates = [central(env, tr, host, n, k)['rate'] for n in range(1, max_n + 1)]
  n = next(i for i, x in enumerate(rates, 1) if x >= 0.95 * max(rates))
  return n, central(env, tr, host, n, k)


def load(name: str, published: str = PUBLISHED) -> Dict[str, Any]:
  with open(os.path.join(published, name)) as f:
    return json.load(f)


def derive(published: str = PUBLISHED) -> Dict[str, float]:
  """The dataclass defaults recomputed from the published files (tests compare them)."""
  def one(name, **kw):  # the one row of a file matching every field given
    (row,) = [r for r in load(name, published)['rows'] if r.items() >= kw.items()]
    return row

  def svc_us(name, **kw):  # server CPU per request: its one core / requests per s
    return 1e6 / one(name, **kw)['requests_per_s']

  def env_us(row):  # 2 processes stepping random actions keep 2 cores busy
    return 2e6 / row['ceiling_per_s'] * FRAMES_PER_STEP[row['env']]

  svc, shm = 'inference_service.json', 'inference_service_shm.json'
  batcher = [svc_us(svc, server='batcher', env='catch', clients=2, K=k) for k in (1, 16, 64)]
  call = [svc_us(svc, server='seed', env='catch', clients=2, K=k) - b
          for k, b in ((1, batcher[0]), (64, batcher[2]))]
  per_env, courier_req = (call[1] - call[0]) / 63, sum(batcher) / 3
  shm1, shm16 = (svc_us(shm, server='batcher', transport='shm', K=k) for k in (1, 16))
  cpu = {k: one('acting_cpu.json', env='catch', actors=2, K=k) for k in (1, 16, 64)}
  pong = one('acting_cpu.json', env='pong', actors=2, K=16)
  shm8 = one('acting_shm.json', env='catch', actors=8, K=1)
  runs, engine = load('atari_engines.json', published), {'engine': 'vector_sync', 'num_envs': 16,
                                                         'delay_ms': 0.0}
  (pong_env,) = [r['cpu_us_per_env_step'] for r in runs['actor'] if r.items() >= engine.items()]
  busy = sorted(r['cores_busy'] for r in runs['actor_runs'] if r.items() >= engine.items())
  return {
      'courier.server_req_us': courier_req, 'courier.policy_call_us': call[0],
      'courier.actor_req_us': cpu[1]['central_actor_cpu_us_per_step'] - env_us(cpu[1]),
      'courier.batch_fill': one(shm, server='seed', transport='courier', K=1)['batch_fill'],
      'shm.server_req_us': shm1 - (shm16 - shm1) / 15,
      'shm.server_req_us_per_env': (shm16 - shm1) / 15,
      'shm.policy_call_us': svc_us(shm, server='seed', transport='shm', K=16) - shm16
      - 16 * per_env,
      'shm.actor_req_us': shm8['shm_actor_cpu_us_per_step'] - env_us(shm8),
      'shm.batch_fill': one(shm, server='seed', transport='shm', K=1)['batch_fill'],
      'catch.env_us': env_us(one('acting.json', env='catch', actors=2, K=16)),
      'catch.policy_us_per_env': per_env,
      'catch.actor_side_call_us': sum((r['actor_cpu_us_per_step'] - env_us(r)) * k
                                      for k, r in cpu.items()) / 3,
      'catch.learner_us': 2e6 / one('learner_speed_r2d2.json', variant='onednn')['transitions/s'],
      'atari.env_us': pong_env, 'atari.env_threads': busy[len(busy) // 2],
      'atari.policy_us_per_env': pong['central_learner_cpu_us_per_step']
      - (courier_req + call[0]) / 16,
      'atari.actor_side_us_per_env': pong['actor_cpu_us_per_step'] - pong_env,
      'atari.learner_us': 2e6 / one('learner_speed.json', variant='onednn')['transitions/s'],
      'host.host_call_us': one('tf_call_floor.json', function='trivial', xla=True)['us_per_call'],
  }


# Every published central-inference row is checked: (file, field prefix of the mode).
SOURCES = [('acting.json', 'central'), ('acting_cpu.json', 'central'),
           ('acting_shm.json', 'central'), ('acting_shm.json', 'shm'),
           ('acting_cross_host.json', 'cross')]
# The machine's speed drifts between days (acting_cross_host.json's quiet run, 2026-11-26:
# the env ceiling 30-36k against 100-166k in the files above, same-host Courier Catch 2x16
# 7,225 against 17,625). A file listed here is first scaled by its own run's row named
# (measured / predicted), so its other rows check the model's shape, not the day's speed.
CALIBRATED_BY = {'acting_cross_host.json': ('central', 'catch', 2, 16)}
# Not claimed: acting.json catch 2x64 misses (+30 %). acting_cpu.json's run of that config
# measured 21 % more (+7 %): the machine's spread, not the model's to fit.
# tests/unit/test_capacity.py holds every other row to TOLERANCE.
UNCLAIMED = {('acting.json', 'central', 'catch', 2, 64),
             # Courier to another emulated host, Catch 2x16: 0.71 of the same host's
             # Courier in the quiet run (0.94 in the loaded one); its CPU per env step was
             # 286 us against 203 (loaded: 265 against 319). The model has one Courier
             # cost for both (one kernel carries both ends of the veth); docs/capacity.md.
             ('acting_cross_host.json', 'cross', 'catch', 2, 16)}
# Rows whose own run supplied a cost (Courier's actor request, Pong's forward pass, shared
# memory's actor request): not independent checks.
IN_SAMPLE = {('acting_cpu.json', 'central', 'catch', 2, 1),
             ('acting_cpu.json', 'central', 'pong', 2, 16), ('acting_shm.json', 'shm', 'catch', 8, 1)}
# (acting_cross_host.json's cross rows are scaled by the same run's same-host Courier 2x16
# row, a different mode's measurement: the cross rows are not in sample.)


def validate(published: str = PUBLISHED) -> List[Dict[str, Any]]:
  """Predicted vs measured env steps/s for every central-inference row (this machine)."""
  def predict_row(env, mode, n, k):
    tr = SHM if mode == 'shm' else COURIER
    return tr, central(CATCH if env == 'catch' else ATARI, tr, THIS_MACHINE, n, k)

  rows = []
  for name, mode in SOURCES:
    file_rows, scale = load(name, published)['rows'], 1.0
    if name in CALIBRATED_BY:
      ref_mode, *ref = CALIBRATED_BY[name]
      ref_row = next(r for r in file_rows if [r['env'], r['actors'], r['K']] == ref)
      scale = (ref_row[f'{ref_mode}_per_s'] / FRAMES_PER_STEP[ref[0]]
               / predict_row(ref[0], ref_mode, *ref[1:])[1]['rate'])
    for row in file_rows:
      env, n, k = row['env'], row['actors'], row['K']
      key, measured = (name, mode, env, n, k), row[f'{mode}_per_s'] / FRAMES_PER_STEP[env]
      tr, p = predict_row(env, mode, n, k)
      p = {**p, 'rate': p['rate'] * scale, 'ceiling': p['ceiling'] * scale}
      rows.append({'file': name, 'env': env, 'actors x K': f'{n} x {k}', 'transport': tr.name,
                   'scale': scale,
                   'predicted': p['rate'], 'measured': measured, 'ratio': p['rate'] / measured,
                   'ceiling': p['ceiling'], 'bound': p['bound'], 'claimed': key not in UNCLAIMED,
                   'in_sample': key in IN_SAMPLE,
                   'within': abs(p['rate'] / measured - 1) <= TOLERANCE})
  return rows


# Hosts predicted for (training: the learner and its reserved cores counted), K=16. Each
# is predicted with every measured device run (DEVICES): the tables give the range.
GPU16 = Host('16 cores + 1 H200', 16, accelerator=True, reserved_cores=2, train=True)
GPU96 = Host('96 cores + 8 H200 (inference on 1, learner on 7)', 96, accelerator=True,
             reserved_cores=8, train=True, devices=8, learner_devices=7)
CPU32 = Host('32 cores, no accelerator', 32, reserved_cores=2, train=True)
GPU12 = Host('12 cores + 1 H200 (an 8th of the 96-core host)', 12, accelerator=True,
             reserved_cores=1, train=True)
HOSTS = [(GPU16, CATCH, SHM), (GPU16, ATARI, SHM),
         (dataclasses.replace(GPU16, name='16 cores + 1 GPU 2x slower than the H200 (ASSUMED)',
                              device_slowdown=2.0), ATARI, SHM),
         (dataclasses.replace(GPU16, name='16 cores + 1 H200, learner not overlapping',
                              learner_overlaps=False), ATARI, SHM),
         (dataclasses.replace(GPU16, name='16 cores + 1 H200, actors remote',
                              actors_on_host=False, link_rtt_us=200.0), ATARI, COURIER),
         (GPU96, CATCH, SHM), (GPU96, ATARI, SHM), (GPU12, ATARI, SHM), (CPU32, CATCH, SHM),
         (CPU32, ATARI, SHM)]


def predict(k: int = 16) -> List[Dict[str, Any]]:
  """Per host of HOSTS: the prediction with each measured device run, and the range."""
  rows = []
  for host, env, tr in HOSTS:
    runs = {}
    for run in DEVICES:
      h = dataclasses.replace(host, device=run)
      n, p = saturation(env, tr, h, k)
      side = actor_side(env, h, 4096, k) if h.actors_on_host else float('nan')
      runs[run] = {'actors': n, 'central': p['rate'], 'ceiling': p['ceiling'],
                   'bound': p['bound'], 'inference on': 'device' if p['device'] else 'cpu',
                   'batch': round(p['batch_envs']), 'actor-side': side,
                   'central / actor-side': p['rate'] / side}
    lo = min(runs.values(), key=lambda r: r['central'])
    hi = max(runs.values(), key=lambda r: r['central'])
    ratios = [r['central / actor-side'] for r in runs.values()]
    sides = [r['actor-side'] for r in runs.values()]
    rows.append({'host': host.name, 'env': f'{env.name}-like', 'transport': tr.name, 'K': k,
                 'actors': f"{lo['actors']}-{hi['actors']}" if lo['actors'] != hi['actors']
                 else str(lo['actors']),
                 'central low': lo['central'], 'central high': hi['central'],
                 'ceiling high': max(r['ceiling'] for r in runs.values()),
                 'bound (slowest run)': lo['bound'], 'inference on': lo['inference on'],
                 'batch': lo['batch'], 'actor-side low': min(sides),
                 'actor-side high': max(sides), 'central / actor-side low': min(ratios),
                 'central / actor-side high': max(ratios), 'runs': runs})
  return rows


def device_table(batch: int = 256) -> List[Dict[str, Any]]:
  """One device alone, per measured run and net: what it serves and trains (env steps/s),
  at `batch` envs per call and at its best measured batch."""
  rows = []
  for nets in DEVICES.values():
    for net in ('nature_cnn', 'impala_lstm'):
      d = nets[net]
      t = d.time_us(batch)
      learn = d.learner_us_per_step
      rows.append({'device': d.name, 'net': net, f'us/env at {batch}': t / batch,
                   f'inference at {batch}': batch * 1e6 / t,
                   '+ TF call floor': batch * 1e6 / (t + THIS_MACHINE.host_call_us),
                   'best batch': max(d.batch_us, key=lambda p: p[0] / p[1])[0],
                   'inference, best': max(b * 1e6 / us for b, us in d.batch_us),
                   'learner': 1e6 / learn,
                   f'inference + learner at {batch}': 1e6 / (t / batch + learn)})
  return rows


def read_anchors(directory: str = ANCHORS) -> Dict[str, Any] | None:
  """{file name: its JSON} of the GPU anchors, or None where they are absent."""
  paths = [os.path.join(directory, name) for name in ANCHOR_FILES]
  if not all(os.path.isfile(p) for p in paths):
    return None
  out = {}
  for name, path in zip(ANCHOR_FILES, paths):
    with open(path, 'rb') as f:
      raw = f.read()
    out[name] = {'sha256': hashlib.sha256(raw).hexdigest(), 'content': json.loads(raw)}
  return out


def recorded_anchors(published: str = PUBLISHED) -> Dict[str, Any]:
  """The anchors as `--publish` copied them into capacity.json (their files' sha256 and
  content), for a tree without ../shared/anchors."""
  return load('capacity.json', published)['anchors']


def derive_devices(anchors: Dict[str, Any]) -> Dict[str, Any]:
  """DEVICES' measured fields recomputed from the anchors (`read_anchors`' form):
  {'<run>.<net>.batch_us': ((batch, us), ...), '<run>.<net>.learner_us_per_step': us}."""
  torch, jax = (anchors[name]['content'] for name in ANCHOR_FILES)
  serve = {'h200-torch-1': torch['serve'], 'h200-torch-2': torch['second_run_same_day'],
           'h200-jax': jax['serve']}
  learn = {'h200-torch-1': torch['learn'], 'h200-torch-2': torch['second_run_learn'],
           'h200-jax': torch['second_run_learn']}  # JAX's learner was not timed
  out = {}
  for run in serve:
    for net in ('nature_cnn', 'impala_lstm'):
      out[f'{run}.{net}.batch_us'] = tuple(
          (r['batch'], r['end_to_end_ms'] * 1e3) for r in serve[run] if r['net'] == net)
      (step,) = [r for r in learn[run] if r['net'] == net and (r['T'], r['B']) == (20, 32)]
      out[f'{run}.{net}.learner_us_per_step'] = step['step_ms'] * 1e3 / FRAMES_PER_LEARNER_STEP
  return out


def show(rows: List[Dict[str, Any]]) -> None:
  def fmt(v):
    return (('-' if v != v else f'{v:,.0f}' if abs(v) >= 100 else f'{v:.2f}')
            if isinstance(v, float) else str(v))
  rows = [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows]
  cells = [list(rows[0])] + [[fmt(v) for v in r.values()] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
  for line in cells:
    print('  '.join(v.rjust(w) for v, w in zip(line, widths)))


def _finite(value: Any) -> Any:
  """JSON without Infinity/NaN (strict parsers refuse them): None instead."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--publish', action='store_true', help='also bench/published/')
  args = parser.parse_args()
  anchors = read_anchors()
  if anchors is None:
    print(f'capacity: the GPU anchors are not in {ANCHORS}: cannot check DEVICES against '
          'them, nor copy them into capacity.json', file=sys.stderr)
    return 2
  drift = [k for k, v in derive_devices(anchors).items()
           if not _close(getattr(DEVICES[k.split('.')[0]][k.split('.')[1]], k.split('.')[2]), v)]
  if drift:
    print(f'capacity: DEVICES differ from the anchors: {drift}', file=sys.stderr)
    return 1
  checks, predictions, claimed = validate(), predict(), [r for r in validate() if r['claimed']]
  print('Validation: central inference here (2 cores, acting only); env steps/s (Pong: frames/4)')
  show(checks)
  worst = max(claimed, key=lambda r: abs(r['ratio'] - 1))['ratio']
  print(f'{sum(r["within"] for r in claimed)} of {len(claimed)} claimed rows within '
        f'±{TOLERANCE:.0%} (worst {worst:.2f}); unclaimed: '
        + ', '.join(f'{r["file"]} {r["env"]} {r["actors x K"]} {r["ratio"]:.2f}'
                    for r in checks if not r['claimed']))
  devices = device_table()
  print('\nOne device alone (env steps/s; measured end to end, TF 2.8 floor added where said)')
  show(devices)
  print('\nPredictions (training, K=16; actors on the host unless remote; env steps/s; low-high '
        'over the measured device runs)')
  show(predictions)
  payload = _finite({
      'command': '.venv/bin/python bench/capacity.py' + (' --publish' if args.publish else ''),
      'tolerance': TOLERANCE, 'validation': checks, 'devices': devices,
      'predictions': predictions,
      'assumptions': [dataclasses.asdict(x) for x in [COURIER, SHM, CATCH, ATARI]
                      + [h for h, *_ in HOSTS]],
      'device_costs': {run: {net: dataclasses.asdict(d) for net, d in nets.items()}
                       for run, nets in DEVICES.items()},
      'anchors': anchors})
  for out in [os.path.join(BENCH, 'results')] + ([PUBLISHED] if args.publish else []):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'capacity.json'), 'w') as f:
      json.dump(payload, f, indent=1)
    print(f'capacity: wrote {os.path.join(out, "capacity.json")}')
  return 0


def _close(a: Any, b: Any) -> bool:
  """Equal to the anchors' precision (1e-4 relative, or 0.01 us)."""
  if isinstance(a, (tuple, list)):
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
  return abs(a - b) <= max(1e-4 * abs(b), 0.01)


if __name__ == '__main__':
  sys.exit(main())
