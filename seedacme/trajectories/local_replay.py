"""A reproducible run's replay for the off-policy agents: in the central process, sampled
by a seeded generator (issue 63, Deliver 2).

Why not Reverb. A reproducible run is a function of its seed (`seedacme.run.schedule`),
and Reverb 0.7's samplers cannot be seeded: their generator is internal to the server
(google-deepmind/reverb#25: "not something we currently support"), and which items a
uniform or prioritized table hands out also depends on when its sampler threads run.
So in a reproducible run the items go to `LocalReplay` instead, in the process where
inference writes them and the learner reads them (the central node), and the learner
samples from it with numpy's generator keyed by (run seed, learner step). The replay
node still starts (the program is the same) and its table stays empty: its size in
progress lines is 0, and its checkpoints hold nothing of the run.

The schedule (`ReplayRoundSchedule`). Acting goes in rounds as for V-trace (the same
round gate): a round is T calls of every training env, each call adds one item per env
(items of n + 1 steps, period 1: SAC's transitions), so each round adds N * T items.
The agent's samples-per-insert ratio s fixes the learner steps per round,
k = s * N * T / B (B items per step); T is the smallest round length that makes k a
whole number of learner calls (`sgd_steps_per_sample` steps each). Learning starts
once the replay holds `min_replay_size` items: after round W. So round r acts after
S(r) = k * max(0, r - lag - W) steps, a function of r, and the k steps between rounds
W + q + lag and W + q + lag + 1 train on the items of rounds 0 .. W + q.

The items. The server hands the sink each call of every training env in env-id order
(`seedacme.serving.rounds`), so items are numbered in (call, env id) order on any split
of the envs, and the sink notes how many there were after each call. Learner step j's
sample is drawn from the items as they stood at the end of its round's last call -- the
newest `replay_size` of them (FIFO eviction, as the Reverb table's) -- by
`numpy.random.default_rng((seed, DOMAIN, j))`, uniformly, with replacement. Items a
lagged schedule's later rounds add meanwhile are not in that window, and a sample waits
until its window is complete, so neither the load nor the thread timing moves it.

What is not kept. The replay is not saved with a round checkpoint (the sink's `state`
is None: the server names it missing, and a resume from it is recorded as not exact
from its round on); nor by the replay node, which never sees these items.

Numpy, the standard library and the sink's assembler; TensorFlow only to hand batches
to the learner.
"""

import collections
import fractions
import threading
import time
from typing import Any, Callable, Deque, Dict, List

import numpy as np
import tree

from seedacme.run.schedule import RoundSchedule
from seedacme.trajectories.assembler import SequenceAssembler
from seedacme.trajectories.sink import TrajectorySink
from seedacme.trajectories.writer import ToItems

_SAMPLE_DOMAIN = 632  # tells the replay's use of the run seed apart from others
MAX_ROUND_LENGTH = 4096  # calls per round beyond which the ratio is refused


class ReplayRoundSchedule(RoundSchedule):
  """Rounds of T calls and k learner steps per round after a warm-up of W rounds
  (module docstring): `learner_steps_for` and `first_round_after` over `RoundSchedule`'s
  call arithmetic."""

  def __init__(self, num_envs: int, samples_per_insert: float | None, batch_size: int,
               steps_per_call: int, item_steps: int, min_items: int, lag: int = 0):
    if samples_per_insert is None or not samples_per_insert > 0:
      raise ValueError(
          f'samples_per_insert={samples_per_insert}: a reproducible run fixes the learner '
          'steps per round by the samples-per-insert ratio; set one > 0')
    ratio = fractions.Fraction(samples_per_insert).limit_denominator(10**6)
    # Learner calls per call of every env: ratio * N / (B * steps_per_call).
    per_call = ratio * num_envs / (batch_size * steps_per_call)
    length = per_call.denominator
    if length > MAX_ROUND_LENGTH:
      raise ValueError(
          f'samples_per_insert={samples_per_insert} with {num_envs} training envs and '
          f'{batch_size * steps_per_call} items per learner call needs rounds of '
          f'{length} calls to give whole learner calls; choose a ratio for which '
          f'samples_per_insert * {num_envs} / {batch_size * steps_per_call} is a '
          'simple fraction')
    super().__init__(num_envs, length, 1, lag=lag)
    self.batch_size = int(batch_size)
    self.samples_per_insert = float(samples_per_insert)
    self.item_steps = int(item_steps)
    self.steps_per_round = int(per_call * length) * int(steps_per_call)
    self.min_items = max(int(min_items), int(batch_size) * int(steps_per_call))
    self.warm_up_rounds = 0  # W: the first round after which the replay holds min_items
    while self.items_through(self.warm_up_rounds) < self.min_items:
      self.warm_up_rounds += 1

  def __repr__(self) -> str:
    return (f'ReplayRoundSchedule(num_envs={self.num_envs}, round_length='
            f'{self.unroll_length}, steps_per_round={self.steps_per_round}, '
            f'warm_up_rounds={self.warm_up_rounds}, lag={self.lag})')

  def items_through(self, round_index: int) -> int:
    """Items the replay holds at the end of round `round_index` (none evicted): every
    env's calls 0 .. last_call, less the first n, each end one item."""
    calls = self.last_call(round_index) + 1
    return self.num_envs * max(0, calls - self.item_steps + 1)

  def learner_steps_for(self, round_index: int) -> int:
    if round_index < 0:
      raise ValueError(f'rounds are >= 0, got {round_index}')
    return max(0, round_index - self.lag - self.warm_up_rounds) * self.steps_per_round

  def first_round_after(self, learner_steps: int) -> int:
    if learner_steps < 0:
      raise ValueError(f'learner steps are >= 0, got {learner_steps}')
    return self.data_round(learner_steps) + self.lag

  def data_round(self, learner_steps: int) -> int:
    """The last round whose items learner step `learner_steps` + 1 samples from."""
    return int(learner_steps) // self.steps_per_round + self.warm_up_rounds


class LocalReplay:
  """Items in insertion order (the sink's), the item count after every call, and
  windows of the newest `capacity` items as they stood after a call."""

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f'replay capacity must be >= 1, got {capacity}')
    self.capacity = int(capacity)
    self._condition = threading.Condition()
    self._items: Deque[Any] = collections.deque()
    self._first = 0  # the index of `_items[0]` (older ones are dropped)
    self._count = 0  # items added in all
    self._after_call: List[int] = []  # items added in all after each call
    self._closed = False

  @property
  def calls(self) -> int:
    with self._condition:
      return len(self._after_call)

  @property
  def size(self) -> int:
    with self._condition:
      return min(self._count, self.capacity)

  def add_call(self, items: List[Any]) -> None:
    """The items one call of every training env made (env-id order)."""
    with self._condition:
      self._items.extend(items)
      self._count += len(items)
      self._after_call.append(self._count)
      self._condition.notify_all()

  def close(self) -> None:
    with self._condition:
      self._closed = True
      self._condition.notify_all()

  def window(self, call: int, timeout_s: float) -> tuple | None:
    """(first, end): the item indices the replay held after call `call`, once that
    call is in (None after `timeout_s`, or once closed)."""
    deadline = time.monotonic() + timeout_s
    with self._condition:
      while len(self._after_call) <= call:
        left = deadline - time.monotonic()
        if self._closed or left <= 0:
          return None
        self._condition.wait(left)
      end = self._after_call[call]
      return max(0, end - self.capacity), end

  def take(self, indices: np.ndarray, keep_from: int) -> List[Any]:
    """The items at `indices`; then drops those before `keep_from` (no later window
    starts before it)."""
    with self._condition:
      if indices.size and int(indices.min()) < self._first:
        raise RuntimeError(f'replay item {int(indices.min())} was dropped (kept from '
                           f'{self._first})')
      out = [self._items[int(i) - self._first] for i in indices]
      while self._first < keep_from and self._items:
        self._items.popleft()
        self._first += 1
      return out


class LocalReplaySink(TrajectorySink):
  """The trajectory sink of a reproducible off-policy run: sequences assembled as by
  `ReverbSequenceSink`, their items added to a `LocalReplay` call by call."""

  def __init__(self, replay: LocalReplay, num_envs: int, length: int, period: int,
               to_items: ToItems):
    self.replay = replay
    self._to_items = to_items
    self._pending: List[Any] = []
    self.items_written = 0
    self.assembler = SequenceAssembler(num_envs, length, period, self._on_sequences)

  def _on_sequences(self, sequences: Any) -> None:
    self._pending.extend(item for _, item in self._to_items(sequences))

  def add(self, env_ids, step) -> None:
    self.assembler.add(env_ids, step)
    items, self._pending = self._pending, []
    self.items_written += len(items)
    self.replay.add_call(items)

  def reset(self, env_ids) -> None:
    self.assembler.reset(env_ids)

  def stats(self) -> Dict[str, float]:
    return {'sequences': self.assembler.sequences_emitted,
            'items_written': self.items_written, 'writer_pending': 0,
            'writer_blocked_s': 0.0, 'items_rewritten': 0, 'writer_reconnects': 0}

  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    del timeout_s
    return True  # added as they are made

  def close(self) -> None:
    self.replay.close()


class LocalReplayBatches:
  """The learner's batches from a `LocalReplay`: learner step j's `steps_per_call *
  batch_size` items drawn uniformly from its round's window (module docstring) by a
  generator keyed by (seed, j). `steps_done` gives j (the learner's step count, which a
  checkpoint restores). `next` returns None while the window is not complete."""

  def __init__(self, replay: LocalReplay, schedule: ReplayRoundSchedule, seed: int,
               sample_size: int, steps_done: Callable[[], int] | None = None,
               timeout_ms: int = 1000):
    self._replay = replay
    self._schedule = schedule
    self._seed = int(seed)
    self.sample_size = int(sample_size)
    self.steps_done = steps_done
    self._timeout_s = timeout_ms / 1e3
    self.partial_batches = 0  # Reverb's counter; a window is never partial here

  def indices(self, step: int, first: int, end: int, size: int) -> np.ndarray:
    """The item indices learner step `step` samples from [first, end)."""
    rng = np.random.default_rng((self._seed, _SAMPLE_DOMAIN, int(step)))
    return rng.integers(first, end, size=size, dtype=np.int64)

  def next(self) -> Any | None:
    """One learner call's `sample_size` items as `[sample_size, ...]` tensors, or None."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if self.steps_done is None:
      raise RuntimeError('LocalReplayBatches: steps_done is not set')
    step = int(self.steps_done())
    s = self._schedule
    size = self.sample_size
    window = self._replay.window(s.last_call(s.data_round(step)), self._timeout_s)
    if window is None:
      return None
    first, end = window
    if end - first < size:
      raise RuntimeError(f'learner step {step}: the replay holds {end - first} items, '
                         f'fewer than a sample of {size} ({s})')
    items = self._replay.take(self.indices(step, first, end, size), keep_from=first)
    batch = tree.map_structure(lambda *xs: np.stack(xs), *items)
    return tree.map_structure(tf.convert_to_tensor, batch)

  def close(self) -> None:
    self._replay.close()
