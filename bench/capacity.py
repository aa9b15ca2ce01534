"""How many env steps/s can one central node serve? A capacity model from measured costs.

    .venv/bin/python bench/capacity.py              # tables; writes bench/results/capacity.json
    .venv/bin/python bench/capacity.py --publish    # also bench/published/capacity.json

Runs nothing: reads bench/published/*.json and predicts (docs/capacity.md). Every cost is
a dataclass field naming the file and field it came from (`derive` recomputes them, a
test compares), so a user can check the arithmetic and put in their own host. A batch
of R requests of K envs costs the one server loop R x the transport's request cost +
the compiled step's call + R*K x the forward pass per env, which an accelerator takes
off the host (its time per batch: an assumption); an actor pays K env steps and its side
of a request. Rate = min(CPU bound, pipeline bound). The pipeline is a convoy, as
measured here: actors step together while the server idles, then wait while it serves
every queued batch: N*K / (stepping + N/R x batch time), tending to the server loop's own
limit as N grows. Where actors and server overlap, `ceiling` = min(CPU, server bounds).
"""

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Dict, List

BENCH = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = os.path.join(BENCH, 'published')
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
class Env:
  """An env with its policy network and learner, CPU microseconds per env step."""
  name: str
  env_us: float  # actor CPU per env step, stepping only
  env_threads: float  # cores an actor's engine keeps busy stepping its K envs
  policy_us_per_env: float  # forward pass per env on the central node's CPU
  device_call_us: float  # ASSUMED: accelerator time per batch = call + B x per env
  device_us_per_env: float
  actor_side_call_us: float  # actor-side inference: actor CPU per call and per env
  actor_side_us_per_env: float
  learner_us: float  # learner CPU per env step when it trains on the host's CPU


# Catch, V-trace MLP 64-64. env: 2e6 / acting.json catch 2x16 ceiling_per_s. forward:
# inference_service.json (seed - batcher) at K=64 minus at K=1, / 63. device: ASSUMED
# ~0.1 ms per call (kernel launches). actor-side: acting_cpu.json catch
# (actor_cpu_us_per_step - env) x K, mean of 2x1/2x16/2x64 (320/410/365). learner:
# learner_speed_r2d2.json onednn 2e6 / transitions/s (R2D2's LSTM-64 step: the small-net
# learner measured; the V-trace MLP's alone was not).
CATCH = Env('catch', 14.5, 1.0, 0.46, 100.0, 0.2, 365.0, 0.0, 9.8)
# Pong, SEED's IMPALA ResNet torso (as bench/acting.py serves it). env: atari_engines.json
# actor vector_sync 16 envs delay 0 cpu_us_per_env_step; threads: median cores_busy of
# those actor_runs. forward: acting_cpu.json pong 2x16 central_learner_cpu_us_per_step
# 2767.9 - Courier's (280.1 + 337.8) / 16 (that row's own rate check is then in-sample).
# device: ASSUMED 0.3 ms + 25 us per env (1.9 ms at B=64; a Nature CNN batch of 64 takes
# 1-2 ms on a V100, the ResNet longer: see the 2x row). actor-side: acting_cpu.json pong
# actor_cpu_us_per_step 2918.5 - env. learner: learner_speed.json onednn 2e6 / transitions/s
# (the Nature CNN's learner: the ResNet's was not measured).
ATARI = Env('atari', 415.0, 1.43, 2729.3, 300.0, 25.0, 0.0, 2503.5, 823.5)


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
  # Host CPU of a call the device runs: tf_call_floor.json trivial xla us_per_call.
  host_call_us: float = 105.0
  device_slowdown: float = 1.0  # multiplies the device time (a sensitivity check)


THIS_MACHINE = Host('this machine', 2)


def central(env: Env, tr: Transport, host: Host, n: int, k: int,
            device: bool | None = None) -> Dict[str, Any]:
  """Central inference, N actors x K envs: predicted env steps/s and what binds it."""
  if device is None:  # with an accelerator, inference runs wherever it is faster
    options = [central(env, tr, host, n, k, d) for d in {False, host.accelerator}]
    return max(options, key=lambda p: p['rate'])
  free, r = host.cores - host.reserved_cores, max(1.0, tr.batch_fill * n)  # r: requests/batch
  b = r * k
  req = r * (tr.server_req_us + tr.server_req_us_per_env * k) + (
      host.host_call_us if device else tr.policy_call_us)
  fwd_cpu = 0.0 if device else b * env.policy_us_per_env
  fwd = ((env.device_call_us + b * env.device_us_per_env) * host.device_slowdown if device
         else fwd_cpu / min(free, host.cpu_forward_threads))
  z_cpu = k * env.env_us + tr.actor_req_us  # an actor's CPU per round
  z_wall = k * env.env_us / env.env_threads + tr.actor_req_us + host.link_rtt_us
  if host.actors_on_host:  # the convoy steps all N actors at once on the free cores
    z_wall = max(z_wall, z_cpu * n / free)
  pipeline = n * k / (z_wall + n / r * (req + fwd)) * 1e6
  per_step = (req + fwd_cpu) / b + (z_cpu / k if host.actors_on_host else 0.0)
  per_step += env.learner_us if host.train and not host.accelerator else 0.0
  cpu, server = free / per_step * 1e6, b / (req + fwd) * 1e6
  parts = {'actors stepping': z_wall, 'server loop': n / r * req,
           'device' if device else 'cpu forward': n / r * fwd}
  return {'rate': min(cpu, pipeline), 'ceiling': min(cpu, server), 'cpu_bound': cpu,
          'pipeline_bound': pipeline, 'server_bound': server, 'device': device,
          'bound': 'cpu' if cpu <= pipeline else max(parts, key=parts.get),
          'batch_envs': b, 'cpu_us_per_step': per_step}


def actor_side(env: Env, host: Host, n: int, k: int) -> float:
  """Actor-side inference (every actor its own network copy): env steps/s."""
  per_step = env.env_us + env.actor_side_call_us / k + env.actor_side_us_per_env
  per_step += env.learner_us if host.train and not host.accelerator else 0.0
  one = k / (k * env.env_us / env.env_threads + env.actor_side_call_us
             + k * env.actor_side_us_per_env)  # one actor with a core of its own
  return min((host.cores - host.reserved_cores) / per_step, n * one) * 1e6


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


# Hosts predicted for (training: the learner and its reserved cores counted), K=16.
GPU16 = Host('16 cores + 1 V100', 16, accelerator=True, reserved_cores=2, train=True)
GPU96 = Host('96 cores + 8 GPUs', 96, accelerator=True, reserved_cores=8, train=True)
CPU32 = Host('32 cores, no accelerator', 32, reserved_cores=2, train=True)
GPU12 = Host('12 cores + 1 GPU (an 8th of it)', 12, accelerator=True, reserved_cores=1,
             train=True)
HOSTS = [(GPU16, CATCH, SHM), (GPU16, ATARI, SHM),
         (dataclasses.replace(GPU16, name='16 cores + 1 V100, device 2x slower',
                              device_slowdown=2.0), ATARI, SHM),
         (dataclasses.replace(GPU16, name='16 cores + 1 V100, actors remote',
                              actors_on_host=False, link_rtt_us=200.0), ATARI, COURIER),
         (GPU96, CATCH, SHM), (GPU96, ATARI, SHM), (GPU12, ATARI, SHM), (CPU32, CATCH, SHM),
         (CPU32, ATARI, SHM)]


def predict(k: int = 16) -> List[Dict[str, Any]]:
  rows = []
  for host, env, tr in HOSTS:
    n, p = saturation(env, tr, host, k)
    side = actor_side(env, host, 4096, k) if host.actors_on_host else float('nan')
    rows.append({'host': host.name, 'env': f'{env.name}-like', 'transport': tr.name, 'K': k,
                 'actors': n, 'central': p['rate'], 'ceiling': p['ceiling'], 'bound': p['bound'],
                 'inference on': 'device' if p['device'] else 'cpu', 'batch': round(p['batch_envs']),
                 'actor-side': side, 'central / actor-side': p['rate'] / side,
                 'ceiling / actor-side': p['ceiling'] / side})
  return rows


def show(rows: List[Dict[str, Any]]) -> None:
  def fmt(v):
    return (('-' if v != v else f'{v:,.0f}' if abs(v) >= 100 else f'{v:.2f}')
            if isinstance(v, float) else str(v))
  cells = [list(rows[0])] + [[fmt(v) for v in r.values()] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
  for line in cells:
    print('  '.join(v.rjust(w) for v, w in zip(line, widths)))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--publish', action='store_true', help='also bench/published/')
  args = parser.parse_args()
  checks, predictions, claimed = validate(), predict(), [r for r in validate() if r['claimed']]
  print('Validation: central inference here (2 cores, acting only); env steps/s (Pong: frames/4)')
  show(checks)
  worst = max(claimed, key=lambda r: abs(r['ratio'] - 1))['ratio']
  print(f'{sum(r["within"] for r in claimed)} of {len(claimed)} claimed rows within '
        f'±{TOLERANCE:.0%} (worst {worst:.2f}); unclaimed: '
        + ', '.join(f'{r["file"]} {r["env"]} {r["actors x K"]} {r["ratio"]:.2f}'
                    for r in checks if not r['claimed']))
  print('\nPredictions (training, K=16; actors on the host unless remote; env steps/s)')
  show(predictions)
  payload = {'tolerance': TOLERANCE, 'validation': checks, 'predictions': predictions, 'assumptions':
             [dataclasses.asdict(x) for x in [COURIER, SHM, CATCH, ATARI] + [h for h, *_ in HOSTS]]}
  for out in [os.path.join(BENCH, 'results')] + ([PUBLISHED] if args.publish else []):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'capacity.json'), 'w') as f:
      json.dump(payload, f, indent=1)
    print(f'capacity: wrote {os.path.join(out, "capacity.json")}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
