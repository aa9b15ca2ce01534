"""The batch step as one compiled call, with every env's recurrent state on the device.

SEED's inference step: per batch, ONE compiled function does

    gather state[env_ids] -> initial state where `reset` -> network -> action
    selection -> scatter next state into state[env_ids]

and returns the actions, what the trajectory sink stores (logits / Q-values) and the
state each env acted from. The state tables are `tf.Variable`s of shape
`[num_envs + 1, ...]` placed on the inference device (the accelerator when there is
one; row `num_envs` is a scratch row that padding writes to), so recurrent state never
makes a host round trip per batch.

Batch sizes are padded up to a fixed set of buckets (1, 2, 3, 4, 6, 8, 12, 16, ...:
powers of two and their halfway points, at most 33 % padding), each traced and
compiled once (`traces` counts them). A call goes straight to its bucket's compiled
graph: no tf.function signature matching, no argument re-checking.

Measured (TF 2.8.4, 2-core EPYC, V-trace MLP 64-64, batch 32, one process, per call):
the previous path (polymorphic tf.function, host state passed in and out as
tf.constants) 575 us; a concrete function per bucket 466 us; this direct call of the
compiled graph 300 us. A trivial compiled function costs ~100 us per call here on a
quiet machine (`bench/tf_call_floor.py`): TF's function-runtime floor, which the
remaining time sits on.

The function is XLA-compiled (`jit_compile`) on an accelerator, and on the CPU only for
vector observations (`use_xla`): XLA fuses an MLP's small ops, but its CPU convolutions
are slower than oneDNN's. Per batch of 16, one process, both variants alternated over
4 rounds (machine shared with an R2D2 Pong run, so absolute times are high; the
ratios are what decided): R2D2 Atari (Nature CNN + LSTM 256) 11.9 ms with XLA vs 6.9 ms
without, V-trace Atari 11.9 vs 7.6; V-trace Catch 0.3 vs 0.4, R2D2 CartPole 0.6 vs 0.8,
SAC HalfCheetah (batch 4) 0.4 vs 0.4.

Action noise comes from one `tf.random.Generator` per policy, seeded with the agent's
seed. So that the training envs' draws depend only on the training batches (a
reproducible run's are the same [N] batches in env-id order on any split), `warm_up`
puts the generator back to its seed after its compiling calls (the buckets it compiles
differ with the split), and a batch of evaluation envs only (greedy: it uses no draw)
leaves the generator as it found it.
"""

import abc
import contextlib
import os
import threading
from typing import Callable, Dict, List, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf
import tree

from seedacme.types import EnvSpec
from seedacme.serving.policy import PolicyStep, ServerPolicy
from seedacme.types import Nest



_placed = threading.local()


@contextlib.contextmanager
def inference_device(device: str):
  """Policies made inside (that are not given a device) run on `device` ('' : the
  default): how the central node places inference without every builder passing it."""
  previous = getattr(_placed, 'device', '')
  _placed.device = device
  try:
    yield
  finally:
    _placed.device = previous


def default_device() -> str:
  """The device `inference_device` set, else the accelerator if there is one, else
  the CPU."""
  if getattr(_placed, 'device', ''):
    return _placed.device
  for kind in ('TPU', 'GPU'):
    if tf.config.list_logical_devices(kind):
      return f'/{kind}:0'
  return '/CPU:0'


def bucket_sizes(max_batch: int) -> Tuple[int, ...]:
  """1, 2, 3, 4, 6, 8, 12, 16, 24, ... below `max_batch`, then `max_batch` itself."""
  if max_batch < 1:
    raise ValueError(f'max_batch must be >= 1, got {max_batch}')
  sizes, power = [], 1
  while True:
    for size in (power, power + power // 2):
      if size >= max_batch:
        return tuple(sorted(set(sizes))) + (max_batch,)
      sizes.append(size)
    power *= 2


def direct_call(concrete) -> Callable[..., List[tf.Tensor]]:
  """A caller of `concrete`'s compiled graph that skips ConcreteFunction.__call__.

  `__call__` re-validates and re-converts its arguments on every call (~100-170 us
  here); the graph underneath takes the flat inputs followed by the captured
  variables. TF 2.8's private `_inference_function.call` is that graph; if a TF
  version lacks it, the public call is used (same results, slower).
  """
  inner = getattr(concrete, '_inference_function', None)
  if inner is None or not hasattr(inner, 'call'):
    logging.warning('TensorFlow %s: no direct call of compiled functions; using the '
                    'public (slower) call path', tf.__version__)
    return lambda *args: tree.flatten(concrete(*args))
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  captured = list(concrete.captured_inputs)
  ctx = context.context()

  def call(*args):
    return inner.call(ctx, [tf.constant(a) for a in args] + captured)
  return call


XLA_VAR = 'SEEDACME_INFERENCE_XLA'  # '1' / '0' overrides `use_xla` (benchmarks compare)


def use_xla(device: str, spec: EnvSpec) -> bool:
  """Whether the batch step is XLA-compiled: on an accelerator, or for observations that
  are not images (no convolutional torso; module docstring for the measurement).
  `SEEDACME_INFERENCE_XLA=1` or `=0` in the environment decides instead."""
  forced = os.environ.get(XLA_VAR, '').strip()
  if forced in ('0', '1'):
    return forced == '1'
  if forced:
    raise ValueError(f'{XLA_VAR}={forced!r}: expected 1 (XLA), 0 (no XLA) or unset')
  on_cpu = 'CPU' in device.upper().rsplit('/', 1)[-1]
  return not on_cpu or len(tuple(spec.observation_shape)) < 3


class TFServerPolicy(ServerPolicy, abc.ABC):
  """Device-resident per-env state and one compiled batch step per bucket.

  Agents implement `_act` (in-graph: network + action selection).
  """

  def __init__(self, network, spec: EnvSpec, num_envs: int, seed: int = 0,
               device: str = ''):
    self._network = network
    self._spec = spec
    self.num_envs = num_envs
    self.device = device or default_device()
    # Calls run where the state lives: on a device other than the first CPU (a placed
    # inference device) the call is pinned there, or XLA compiles it for CPU:0.
    self._pin = (contextlib.nullcontext if self.device in ('/CPU:0', '/device:CPU:0')
                 else lambda: tf.device(self.device))
    self.buckets = bucket_sizes(num_envs)
    self.traces = 0  # batch-step traces: one per bucket used, never more
    self._seed = seed
    with tf.device(self.device):
      self._rng = tf.random.Generator.from_seed(seed)
      initial = network.initial_state(1)
      self._initial = tree.map_structure(tf.convert_to_tensor, initial)
      # Row num_envs is scratch: padded rows of a bucket write their state there.
      self._table = tree.map_structure(
          lambda x: tf.Variable(tf.repeat(x, num_envs + 1, axis=0), trainable=False,
                                name='env_state'), self._initial)
    self._state_leaves = len(tree.flatten(self._initial))
    self.jit_compile = use_xla(self.device, spec)
    self._batch_step = tf.function(self._batch_step_graph, jit_compile=self.jit_compile)
    self._calls: Dict[int, Callable[..., List[tf.Tensor]]] = {}
    self._extras_keys: Tuple[str, ...] | None = None

  @abc.abstractmethod
  def _act(self, observation: tf.Tensor, state: Nest, eval_mask: tf.Tensor,
           env_ids: tf.Tensor) -> Tuple[tf.Tensor, Dict[str, tf.Tensor], Nest]:
    """In-graph: `(action [B, *action_shape], extras {name: [B, ...]}, next_state)`;
    actions are int32 indices or, for continuous actions, the env's (bounded) values."""

  def _batch_step_graph(self, env_ids, observation, reset, eval_mask):
    self.traces += 1
    with tf.device(self.device):
      def initial_where_reset(stored, initial):
        mask = tf.reshape(reset, [-1] + [1] * (stored.shape.rank - 1))
        return tf.where(mask, tf.cast(initial, stored.dtype), stored)
      state = tree.map_structure(lambda v: tf.gather(v, env_ids), self._table)
      state = tree.map_structure(initial_where_reset, state, self._initial)
      action, extras, next_state = self._act(observation, state, eval_mask, env_ids)
      for var, new in zip(tree.flatten(self._table), tree.flatten(next_state)):
        var.scatter_nd_update(env_ids[:, None], tf.cast(new, var.dtype))
    self._extras_keys = tuple(sorted(extras))
    return (tf.cast(action, tf.as_dtype(self._spec.action_dtype)),) + tuple(extras[k] for k in self._extras_keys) + \
        tuple(tree.flatten(state))

  def _call_for(self, bucket: int) -> Callable[..., List[tf.Tensor]]:
    call = self._calls.get(bucket)
    if call is None:
      concrete = self._batch_step.get_concrete_function(
          tf.TensorSpec([bucket], tf.int32),
          tf.TensorSpec((bucket,) + tuple(self._spec.observation_shape),
                        tf.as_dtype(self._spec.dtype)),
          tf.TensorSpec([bucket], tf.bool), tf.TensorSpec([bucket], tf.bool))
      call = self._calls[bucket] = direct_call(concrete)
    return call

  def _bucket(self, size: int) -> int:
    for bucket in self.buckets:
      if bucket >= size:
        return bucket
    raise ValueError(f'batch of {size} envs; this policy holds state for '
                     f'{self.num_envs} envs and a batch has each env at most once')

  def warm_up(self, batch_sizes: Sequence[int]) -> None:
    """Traces (and XLA-compiles) the buckets of these batch sizes (an all-reset step of
    the scratch row only: no env's state changes; the noise generator is put back to
    its seed after)."""
    for bucket in sorted({self._bucket(b) for b in batch_sizes}):
      with self._pin():
        self._call_for(bucket)(
            np.full(bucket, self.num_envs, np.int32),
            np.zeros((bucket,) + tuple(self._spec.observation_shape), self._spec.dtype),
            np.ones(bucket, bool), np.ones(bucket, bool))
    with tf.device(self.device):
      self._rng.reset_from_seed(self._seed)

  def step(self, env_ids: np.ndarray, observation: np.ndarray, reset: np.ndarray,
           eval_mask: np.ndarray) -> PolicyStep:
    size = len(env_ids)
    bucket = self._bucket(size)
    ids = np.asarray(env_ids, np.int32)
    reset = np.asarray(reset, bool)
    eval_mask = np.asarray(eval_mask, bool)
    # Evaluation envs only: their greedy actions use no noise, and the training envs'
    # draws must not depend on when the evaluator asked (module docstring).
    noise_state = self._rng.state.read_value() if eval_mask.all() else None
    if bucket != size:
      pad = bucket - size
      ids = np.concatenate([ids, np.full(pad, self.num_envs, np.int32)])
      observation = np.concatenate(
          [observation, np.zeros((pad,) + observation.shape[1:], observation.dtype)])
      reset = np.concatenate([reset, np.ones(pad, bool)])
      eval_mask = np.concatenate([eval_mask, np.ones(pad, bool)])
    with self._pin():
      outputs = self._call_for(bucket)(ids, observation, reset, eval_mask)
    if noise_state is not None:
      self._rng.state.assign(noise_state)
    outputs = [o.numpy()[:size] for o in outputs]
    # No action reaches an env unchecked: a diverged network's NaN, or an action head
    # that leaves the bounds, stops the run with this error (InferenceServer).
    self._spec.check_actions(outputs[0])
    n_extras = len(self._extras_keys)
    state = tree.unflatten_as(self._initial, outputs[1 + n_extras:]) \
        if self._state_leaves else ()
    return PolicyStep(action=outputs[0],
                      extras=dict(zip(self._extras_keys, outputs[1:1 + n_extras])),
                      state=state)

  def state_of(self, env_ids: Sequence[int]) -> Nest:
    ids = np.asarray(env_ids, np.int32)
    return tree.map_structure(lambda v: tf.gather(v, ids).numpy(), self._table)

  def acting_state(self, env_ids: Sequence[int]) -> Dict[str, object]:
    """These envs' recurrent state and the noise generator's state (host copies)."""
    return {'state': self.state_of(env_ids), 'noise': self._rng.state.numpy().copy()}

  def load_acting_state(self, env_ids: Sequence[int], state: Dict[str, object]) -> None:
    """Puts back `acting_state(env_ids)`: the envs' rows of the state table and the
    noise generator (between batches)."""
    ids = np.asarray(env_ids, np.int32)[:, None]
    with tf.device(self.device):
      for var, value in zip(tree.flatten(self._table), tree.flatten(state['state'])):
        var.scatter_nd_update(ids, tf.constant(value, var.dtype))
      self._rng.state.assign(state['noise'])

  def initial_state(self, batch_size: int) -> Nest:
    """The initial recurrent state of `batch_size` envs (numpy)."""
    return tree.map_structure(lambda x: np.repeat(x.numpy(), batch_size, axis=0),
                              self._initial)
