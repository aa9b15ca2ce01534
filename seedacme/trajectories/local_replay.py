"""A reproducible run's replay for the off-policy agents: in the central process, sampled
by a seeded generator (issue 63, Deliver 2).

Why not Reverb. A reproducible run is a function of its seed (`seedacme.run.schedule`),
and Reverb 0.7's samplers cannot be seeded: their generator is internal to the server
(google-deepmind/reverb#25: "not something we currently support"), and which items a
uniform or prioritized table hands out also depends on when its sampler threads run.
So in a reproducible run of SAC or R2D2 the items go to `LocalReplay` instead, in the
process where inference writes them and the learner reads them (the central node), and
the learner samples from it with numpy's generator keyed by (run seed, learner step). The replay
node still starts (the program is the same) and its table stays empty: its size in
progress lines is 0, and its checkpoints hold nothing of the run.

The schedule (`ReplayRoundSchedule`). Acting goes in rounds as for V-trace (the same
round gate): a round is T calls of every training env; each env ends an item every P
calls (SAC's transitions: P = 1; R2D2's sequences: its `period`, T a multiple of P), so
each round adds N * T / P items. The agent's samples-per-insert ratio s fixes the
learner steps per round, k = s * N * T / (P * B) (B items per step); T is the smallest round length that makes k a
whole number of learner calls (`sgd_steps_per_sample` steps each). Learning starts
once the replay holds `min_replay_size` items: after round W. So round r acts after
S(r) = k * max(0, r - lag - W) steps, a function of r, and the k steps between rounds
W + q + lag and W + q + lag + 1 train on the items of rounds 0 .. W + q.

The items. The server hands the sink each call of every training env in env-id order
(`seedacme.serving.rounds`), so items are numbered in (call, env id) order on any split
of the envs, and the sink notes how many there were after each call. Learner step j's
sample is drawn from the items as they stood at the end of its round's last call -- the
newest `replay_size` of them (FIFO eviction, as the Reverb table's) -- by
`numpy.random.default_rng((seed, DOMAIN, j))`, with replacement: uniformly (SAC), or
in proportion to priority^a (R2D2's `priority_exponent`, as Reverb's `Prioritized(a)`),
handing the learner each item's probability and the window's size for its importance
weights. Priorities start as the sink's (R2D2: the server's estimate from the Q-values
it acted with) and the learner sets its new ones after its step, before its next draw:
in learner-step order. Items a lagged schedule's later rounds add meanwhile are not in
that window, and a sample waits until its window is complete, so neither the load nor
the thread timing moves it.

Resume. The sink's `state` holds the partial sequences and the whole replay (items,
priorities, the count after every call), so a round checkpoint (`seedacme.run.resume`)
continues exactly: the restored learner's step count keys the next draw, and the calls
go on being numbered as the round gate's. A learner restored without it (a checkpoint
on the clock: the run is then marked not exact) counts rounds from its restored step, as
the gate does (`RoundGate.resume_at`), and the replay fills again over the warm-up
rounds. The replay node's checkpoints never see these items.

Why ~420 lines: the schedule, the replay, its sink and its sampler are one contract
(the schedule's windows are what the sink's call counts and the sampler's draws refer
to); apart, each would restate the others' arithmetic.

Numpy, the standard library and the sink's assembler; TensorFlow only to hand batches
to the learner.
"""

import fractions
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

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
               steps_per_call: int, item_steps: int, min_items: int, lag: int = 0,
               item_period: int = 1):
    if samples_per_insert is None or not samples_per_insert > 0:
      raise ValueError(
          f'samples_per_insert={samples_per_insert}: a reproducible run fixes the learner '
          'steps per round by the samples-per-insert ratio; set one > 0 (--agent_config '
          'samples_per_insert=...)')
    if not 1 <= item_period <= item_steps:
      raise ValueError(f'need 1 <= item_period <= item_steps, got {item_period}, '
                       f'{item_steps}')
    ratio = fractions.Fraction(samples_per_insert).limit_denominator(10**6)
    # Learner calls per call of every env: ratio * N / (P * B * steps_per_call), each
    # env ending an item every P calls; a round is a whole number of periods.
    per_call = ratio * num_envs / (item_period * batch_size * steps_per_call)
    length = item_period * (per_call * item_period).denominator
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
    self.item_steps, self.item_period = int(item_steps), int(item_period)
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
    """Items the replay holds at the end of round `round_index` (none evicted): each
    env's first item ends at its call `item_steps` - 1, and one more every
    `item_period` calls."""
    calls = self.last_call(round_index) + 1
    if calls < self.item_steps:
      return 0
    return self.num_envs * ((calls - self.item_steps) // self.item_period + 1)

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
  """Items in insertion order (the sink's) with their priorities, the item count after
  every call, and windows of the newest `capacity` items as they stood after a call.

  Items are nests of arrays of one structure, kept field by field in growing arrays
  (row g - `_base` holds item g): a sample is one gather per field, and a checkpoint's
  state a slice of each, not a million small arrays to pickle.
  """

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f'replay capacity must be >= 1, got {capacity}')
    self.capacity = int(capacity)
    self._condition = threading.Condition()
    self._structure: Any = None  # the items' nest (set by the first item)
    self._columns: List[np.ndarray] = []  # per field: rows of items `_base` ..
    self._priorities = np.zeros(0, np.float64)
    self._base = 0  # the item in row 0 (<= `_first`: compacted now and then)
    self._first = 0  # the oldest item kept (older ones are dropped)
    self._count = 0  # items added in all
    self._after_call: List[int] = []  # items added in all after each call
    self._closed = False
    self.restored = False  # loaded from a round checkpoint (`load_state`)

  @property
  def calls(self) -> int:
    with self._condition:
      return len(self._after_call)

  @property
  def size(self) -> int:
    with self._condition:
      return min(self._count, self.capacity)

  def _reserve(self, rows: int, template: List[np.ndarray]) -> None:
    """Room for `rows` rows from row 0 (grown by doubling; `template`: one row's
    leaves, for a first allocation)."""
    have = self._priorities.size
    if rows <= have:
      return
    size = max(1024, 2 * rows)
    stored = self._count - self._base
    if not self._columns:
      self._columns = [np.zeros((size,) + x.shape, x.dtype) for x in template]
    else:
      grown = []
      for column in self._columns:
        bigger = np.zeros((size,) + column.shape[1:], column.dtype)
        bigger[:stored] = column[:stored]
        grown.append(bigger)
      self._columns = grown
    priorities = np.zeros(size, np.float64)
    priorities[:stored] = self._priorities[:stored]
    self._priorities = priorities

  def add_call(self, items: List[Any], priorities: Any = None) -> None:
    """The items one call of every training env made (env-id order), with their
    priorities (default 1)."""
    priorities = np.ones(len(items)) if priorities is None else \
        np.asarray(priorities, np.float64)
    with self._condition:
      if items:
        if self._structure is None:
          self._structure = items[0]
        leaves = [tree.flatten(item) for item in items]
        stored = self._count - self._base
        self._reserve(stored + len(items), [np.asarray(x) for x in leaves[0]])
        for column, values in zip(self._columns, zip(*leaves)):
          column[stored:stored + len(items)] = np.stack(values)
        self._priorities[stored:stored + len(items)] = priorities
      self._count += len(items)
      self._after_call.append(self._count)
      self._condition.notify_all()

  def close(self) -> None:
    with self._condition:
      self._closed = True
      self._condition.notify_all()

  def state(self) -> Dict[str, Any]:
    """What `load_state` continues from: the items kept, their priorities and the
    count after every call (a round checkpoint's, at a round's start)."""
    with self._condition:
      rows = slice(self._first - self._base, self._count - self._base)
      items = None if self._structure is None else tree.unflatten_as(
          self._structure, [column[rows].copy() for column in self._columns])
      return {'capacity': self.capacity, 'first': self._first, 'count': self._count,
              'items': items, 'after_call': np.asarray(self._after_call, np.int64),
              'priorities': self._priorities[rows].copy()}

  def load_state(self, state: Dict[str, Any]) -> None:
    """Continues from `state()` (before any item is added)."""
    with self._condition:
      self._first, self._count = int(state['first']), int(state['count'])
      self._base = self._first
      self._after_call = [int(c) for c in state['after_call']]
      self._priorities = np.array(state['priorities'], np.float64)
      self._structure, self._columns = None, []
      if state['items'] is not None:
        columns = [np.array(x) for x in tree.flatten(state['items'])]
        self._structure = tree.unflatten_as(
            state['items'], [np.zeros((0,) + c.shape[1:], c.dtype) for c in columns])
        self._columns = columns
      self.restored = True

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

  def priorities(self, first: int, end: int) -> np.ndarray:
    """A copy of the priorities of items `first` .. `end` - 1 (still kept)."""
    with self._condition:
      if first < self._first:
        raise RuntimeError(f'replay item {first} was dropped (kept from {self._first})')
      return self._priorities[first - self._base:end - self._base].copy()

  def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
    """Sets the priorities of items `keys` in order (a key twice: the last wins);
    items dropped meanwhile are skipped. The number set."""
    keys = np.asarray(keys, np.int64)
    with self._condition:
      keep = (keys >= self._first) & (keys < self._count)
      self._priorities[keys[keep] - self._base] = np.asarray(priorities, np.float64)[keep]
      return int(keep.sum())

  def take(self, indices: np.ndarray, keep_from: int) -> Any:
    """The items at `indices`, stacked (`[len(indices), ...]` per field); then drops
    those before `keep_from` (no later window starts before it)."""
    with self._condition:
      if indices.size and int(indices.min()) < self._first:
        raise RuntimeError(f'replay item {int(indices.min())} was dropped (kept from '
                           f'{self._first})')
      rows = np.asarray(indices, np.int64) - self._base
      out = tree.unflatten_as(self._structure, [column[rows] for column in self._columns])
      self._first = max(self._first, min(int(keep_from), self._count))
      dropped, stored = self._first - self._base, self._count - self._base
      if dropped > max(1024, stored // 2):  # compact, seldom
        self._columns = [column[dropped:stored].copy() for column in self._columns]
        self._priorities = self._priorities[dropped:stored].copy()
        self._base = self._first
      return out


class LocalReplaySink(TrajectorySink):
  """The trajectory sink of a reproducible off-policy run: sequences assembled as by
  `ReverbSequenceSink`, their items added to a `LocalReplay` call by call."""

  def __init__(self, replay: LocalReplay, num_envs: int, length: int, period: int,
               to_items: ToItems):
    self.replay = replay
    self._to_items = to_items
    self._pending: List[Any] = []  # (priority, item) of the call being added
    self.items_written = 0
    self.assembler = SequenceAssembler(num_envs, length, period, self._on_sequences)

  def _on_sequences(self, sequences: Any) -> None:
    self._pending.extend(self._to_items(sequences))

  def add(self, env_ids, step) -> None:
    self.assembler.add(env_ids, step)
    pending, self._pending = self._pending, []
    self.items_written += len(pending)
    self.replay.add_call([item for _, item in pending], [p for p, _ in pending])

  def reset(self, env_ids) -> None:
    self.assembler.reset(env_ids)

  def state(self) -> Dict[str, Any]:
    """The partial sequences and the whole replay: a round checkpoint holds both (its
    size grows with the replay's)."""
    return {'assembler': self.assembler.state(), 'replay': self.replay.state(),
            'items_written': self.items_written}

  def load_state(self, state: Dict[str, Any]) -> None:
    self.assembler.load_state(state['assembler'])
    self.replay.load_state(state['replay'])
    self.items_written = int(state['items_written'])

  def stats(self) -> Dict[str, float]:
    return {'sequences': self.assembler.sequences_emitted,
            'items_written': self.items_written, 'writer_pending': 0,
            'writer_blocked_s': 0.0, 'items_rewritten': 0, 'writer_reconnects': 0}

  def wait_until_written(self, timeout_s: float = 10.0) -> bool:
    del timeout_s
    return True  # added as they are made

  def close(self) -> None:
    self.replay.close()


class SampleInfo(NamedTuple):
  """What Reverb's `SampleInfo` tells a prioritized learner, for a local sample."""
  key: Any  # [size] int64: the items' indices (what `update_priorities` takes)
  probability: Any  # [size] float64: each item's probability of being drawn
  table_size: Any  # int64: the items in the window drawn from


class LocalReplayBatches:
  """The learner's batches from a `LocalReplay`: learner step j's `sample_size` items
  drawn with replacement from its round's window (module docstring) by a generator keyed
  by (seed, j) -- uniformly, or with `priority_exponent` a in proportion to priority^a
  (as Reverb's `Prioritized(a)`), then as `(SampleInfo, batch)`. `steps_done` gives j
  (the learner's step count, which a checkpoint restores). `next` returns None while
  the window is not complete."""

  def __init__(self, replay: LocalReplay, schedule: ReplayRoundSchedule, seed: int,
               sample_size: int, steps_done: Callable[[], int] | None = None,
               priority_exponent: float | None = None, signature: Any = None,
               timeout_ms: int = 1000):
    """`signature`: the items' `tf.TensorSpec`s (batches are cast to their dtypes, as
    Reverb's are; None: as stored)."""
    self._replay = replay
    self._signature = signature
    self._schedule = schedule
    self._seed = int(seed)
    self.sample_size = int(sample_size)
    self.steps_done = steps_done
    self._exponent = priority_exponent
    self._timeout_s = timeout_ms / 1e3
    self._steps_at_start: int | None = None  # set by the first `next`
    self.partial_batches = 0  # Reverb's counter; a window is never partial here

  def draw(self, step: int, first: int, end: int, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """(item indices, their probabilities): learner step `step`'s draw from [first, end)."""
    rng = np.random.default_rng((self._seed, _SAMPLE_DOMAIN, int(step)))
    n = end - first
    if self._exponent is None:
      return rng.integers(first, end, size=size, dtype=np.int64), np.full(size, 1.0 / n)
    weights = np.power(self._replay.priorities(first, end), self._exponent)
    total = weights.sum()
    # All at priority 0: uniform (Reverb's prioritized sampler does the same).
    p = weights / total if total > 0 else np.full(n, 1.0 / n)
    picked = rng.choice(n, size=size, p=p)
    return first + picked.astype(np.int64), p[picked]

  def next(self) -> Any | None:
    """One learner call's `sample_size` items as `[sample_size, ...]` tensors (with a
    priority exponent: `(SampleInfo, batch)`), or None."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if self.steps_done is None:
      raise RuntimeError('LocalReplayBatches: steps_done is not set')
    step = int(self.steps_done())
    if self._steps_at_start is None:
      # A learner restored without its replay (a checkpoint without a round state):
      # rounds count from its step as the round gate's do (`RoundGate.resume_at`), and
      # the replay fills again for the warm-up rounds.
      self._steps_at_start = 0 if self._replay.restored else step
    s = self._schedule
    size = self.sample_size
    window = self._replay.window(s.last_call(s.data_round(step - self._steps_at_start)),
                                 self._timeout_s)
    if window is None:
      return None
    first, end = window
    if end - first < size:
      raise RuntimeError(f'learner step {step}: the replay holds {end - first} items, '
                         f'fewer than a sample of {size} ({s})')
    keys, probability = self.draw(step, first, end, size)
    batch = self._replay.take(keys, keep_from=first)
    if self._signature is not None:
      batch = tree.map_structure(lambda x, spec: x.astype(spec.dtype.as_numpy_dtype),
                                 batch, self._signature)
    batch = tree.map_structure(tf.convert_to_tensor, batch)
    if self._exponent is None:
      return batch
    return SampleInfo(tf.constant(keys), tf.constant(probability),
                      tf.constant(end - first, tf.int64)), batch

  def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
    """The learner's new priorities (after its step, before its next sample)."""
    return self._replay.update_priorities(keys, priorities)

  def close(self) -> None:
    self._replay.close()
