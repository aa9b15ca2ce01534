"""Exact resume of a reproducible run: round checkpoints (issue 63 Deliver 3).

A reproducible run (`seedacme.run.schedule`) is exact across a kill when it resumes
from a state that the uninterrupted run also passed through, and that state holds
everything later rounds depend on. A wall-clock checkpoint does not: it falls
mid-round, with calls in flight, unrolls half in the queue and the envs' episodes in
the actors. So a reproducible run checkpoints at rounds instead: every
`checkpoint_rounds`-th round (`ProgramConfig.checkpoint_rounds`), at the round's
start, in the round gate's hook. There the state is quiescent: the weights are the
version the round acts with (lag 0), the learner stands at S(r) and waits for the
round's start to take its next step, and no batch is being served. With a lag L the
learner has yet to take the L rounds before r: the trajectory sink keeps their L x N
unrolls (`TrajectorySink.keep_recent`), the round state holds them, and a resume writes
them to the emptied queue again, in their order, before round r's.

What a round checkpoint holds:
* the TF checkpoint as before (weights, optimizer, learner steps, counters);
* the round state (`RoundCheckpoints`, `<logdir>/checkpoints/rounds/round-<r>.pkl`):
  the round and the gate's call count; the inference server's state of every training
  env (recurrent state, the noise generator, the partial unroll -- the one step the
  next unroll starts with --, the episodes in progress, the training counts and the
  returns window the round records average over: `InferenceServer.round_state`); the
  learner's state outside TF variables (`Learner.resume_state`: PPO's per-env
  returns) and its last metrics (the resumed round's record carries them); and the
  envs, by global env id.
* The envs live in the actors. An actor knows from its call count which of its
  requests is a checkpoint round's first (`checkpoint_round`), and before sending it
  pickles its envs with their current timesteps (`BatchedEnv.snapshot`) and hands
  them to the central node (`CentralNode.env_snapshot`, keyed by global env id, so a
  resume may split the envs differently). The round's batch forms only once every
  env's request is in, so by the hook every snapshot has arrived. The central node
  keeps the blobs as opaque bytes (it never unpickles them) and writes them with the
  round state. An env that cannot be pickled, or an engine that cannot snapshot
  (Atari's vector engines), is said instead, by name.

The TF checkpoint is written after the round state, so a checkpoint always has one;
a resume takes the round state whose learner steps are the checkpoint's. Only round
checkpoints are saved in a reproducible run (no wall-clock saves, none when a signal
stops it mid-round): a resume always starts at a round, losing at most
`checkpoint_rounds` rounds. A run that ends at a budget or a target saves at that
round too, for its final weights, but the actors snapshot only at checkpoint rounds:
a resume (a larger budget) starts from the newest checkpoint whose round state has
every env (`continues_exactly`, `Checkpointer.restore(prefer=...)`), the checkpoint
round before, and is the uninterrupted run.

On resume the central node restores the server's state and puts the gate at the
round's first call; each actor asks for its envs (`CentralNode.resume_envs`, answered
only for envs not served since the restore: a restarted actor mid-run gets nothing and
is recorded as today), restores them and sends that round's first request, counting
its calls from there. Whatever is missing -- an env snapshot, a part of the server's
state, a round state for the checkpoint -- makes the run not exact from the resumed
round (`RoundGate.not_exact`), named in the summary, never hidden.

Pickles: the central node unpickles only the round states it wrote in its own
logdir (as it reads its TF checkpoints there), never an actor's blobs; an actor
unpickles only what its run's central node returns, over the run's authenticated
channels. An env whose pickling silently drops its state would resume from a fresh env:
gymnasium's `EzPickle` envs do, and `GymnasiumEnv` saves MuJoCo's state beside them and
refuses the others by name (`seedacme.envs.gym_adapter`); DMLab's and Football's envs
are not checked here.

The evaluator's part: its calls are counted as a training env's, but it runs ahead of
training or behind it, so its state is saved when it reaches a checkpoint round's first
call number, not at training's round start: it hands in its envs as an actor does, and
the server's hook (`InferenceServer.on_eval_call`) gives its passes' state
(`EvalPasses.state`: the pass being played and its weights, the episodes counted, the
records) and the eval policy's state of its envs; once both are in, the central node
writes them (`eval-<r>.pkl`). A resume at round r restores them and hands the
evaluator its envs; the copies of later rounds' weights are taken again as training
reaches them.

Not exact, and recorded as such: a central node restarted alone (its actors go on
from where they are, not from the round: `exact_until_round` is the resumed round), a
round state without the L rounds of unrolls a lagged run needs, an evaluator that had
not reached the resumed round (its passes after the resume are marked not exact).

Why this shape rather than actors writing their envs beside the checkpoint: actors
import no TensorFlow and may run on other hosts than the logdir's writer (a `gs://`
logdir), while the central node already writes the checkpoint; and the central node
alone decides that a round is the one a resume continues at.

Numpy and the standard library only at import: actors import `checkpoint_round` and
`ActorSnapshots`.
"""

import os
import pickle
import re
import threading
import uuid
from typing import Any, Callable, Dict, List, Sequence, Tuple

from absl import logging
from seedacme.run import logdir as logdir_lib

ROUNDS_DIR = 'rounds'  # under <logdir>/checkpoints


def checkpoint_round(call_index: int, unroll_length: int, every_rounds: int) -> int | None:
  """The round whose first call is `call_index`, if it is a checkpoint round (every
  `every_rounds`-th: rounds k, 2k, ...), else None. Round r >= 1 starts at call
  rT + 1 (`seedacme.run.schedule`)."""
  if call_index < 1 or (call_index - 1) % unroll_length:
    return None
  r = (call_index - 1) // unroll_length
  return r if r >= every_rounds and r % every_rounds == 0 else None


class RoundCheckpoints:
  """The round states of a run's checkpoints (`<checkpoints>/rounds/round-<r>.pkl`),
  each written whole (to a temporary file, then renamed); the newest `keep` stay."""

  def __init__(self, checkpoint_dir: str, keep: int = 3, prefix: str = 'round'):
    """`prefix`: the files' (`eval`: the evaluator's part of each round checkpoint,
    written when the evaluator reaches the round, which may be before or after
    training does)."""
    self.directory = os.path.join(checkpoint_dir, ROUNDS_DIR)
    self._keep = keep
    self._prefix = prefix
    self._name = re.compile(rf'^{prefix}-(\d+)\.pkl$')
    self._fs = logdir_lib.filesystem(self.directory)

  def _rounds(self) -> List[int]:
    if not self._fs.exists(self.directory):
      return []
    found = (self._name.match(name) for name in self._fs.listdir(self.directory))
    return sorted(int(m.group(1)) for m in found if m)

  def _path(self, round_index: int) -> str:
    return os.path.join(self.directory, f'{self._prefix}-{round_index}.pkl')

  def read(self, round_index: int) -> Dict[str, Any] | None:
    """Round `round_index`'s state, or None (not saved)."""
    path = self._path(round_index)
    return pickle.loads(self._fs.read(path)) if self._fs.exists(path) else None

  def write(self, round_index: int, state: Dict[str, Any]) -> str:
    """Writes round `round_index`'s state (and drops the oldest beyond `keep`)."""
    self._fs.makedirs(self.directory)
    path = self._path(round_index)
    tmp = os.path.join(self.directory,
                       f'.{self._prefix}-{round_index}.tmp-{uuid.uuid4().hex[:8]}')
    self._fs.write(tmp, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    self._fs.rename(tmp, path)
    for old in self._rounds()[:-self._keep]:
      try:
        self._fs.remove(self._path(old))
      except OSError as e:  # kept: harmless, and said
        logging.warning('Cannot remove the old round state %s: %s', self._path(old), e)
    return path

  def find(self, learner_steps: int) -> Dict[str, Any] | None:
    """The newest round state saved at `learner_steps` (a checkpoint's), or None."""
    for r in reversed(self._rounds()):
      state = pickle.loads(self._fs.read(self._path(r)))
      if state.get('learner_steps') == learner_steps:
        return state
    return None


def continues_exactly(state: Dict[str, Any] | None) -> bool:
  """Whether a round state holds everything an exact resume needs: every env, and
  every part of the server's state."""
  return state is not None and not state.get('envs_missing') and \
      not state['server'].get('missing')


class EnvSnapshots:
  """The central node's collection of the envs' snapshots, per checkpoint round, as
  the actors hand them in (before that round's first request); thread-safe."""

  def __init__(self, num_envs: int):
    self._num_envs = num_envs
    self._lock = threading.Lock()
    self._blobs: Dict[int, Dict[int, bytes]] = {}
    self._refused: Dict[int, str] = {}

  def offer(self, round_index: int, env_ids: Sequence[int],
            blobs: Sequence[bytes] | None, why: str | None = None) -> None:
    """Envs `env_ids`' snapshots at round `round_index` (or None and why not)."""
    ids = [int(i) for i in env_ids]
    if any(not 0 <= i < self._num_envs for i in ids):
      raise ValueError(f'env snapshot for env ids {ids[:16]}: training envs are '
                       f'0..{self._num_envs - 1}')
    with self._lock:
      if blobs is None:
        self._refused.setdefault(round_index, why or 'not said')
        return
      if len(blobs) != len(ids) or not all(isinstance(b, bytes) for b in blobs):
        raise ValueError(f'{len(blobs)} env snapshots for {len(ids)} env ids')
      self._blobs.setdefault(round_index, {}).update(zip(ids, blobs))

  def take(self, round_index: int) -> Tuple[Dict[int, bytes], str | None]:
    """Round `round_index`'s snapshots (forgetting it and every earlier round's), and
    why they cannot resume exactly (None: every env's is there)."""
    with self._lock:
      blobs = self._blobs.pop(round_index, {})
      why = self._refused.pop(round_index, None)
      for r in [r for r in list(self._blobs) + list(self._refused) if r < round_index]:
        self._blobs.pop(r, None)
        self._refused.pop(r, None)
    if why is None and len(blobs) < self._num_envs:
      missing = sorted(set(range(self._num_envs)) - set(blobs))
      why = f'no snapshot of envs {missing[:16]} at round {round_index}'
    return blobs, why


class ActorSnapshots:
  """An actor's part of round checkpoints (module docstring): `resume` restores its
  envs if the central node continues at a round; `maybe_save` hands them in before a
  checkpoint round's first request.

  `send(round, env_ids, blobs, why)` and `fetch(env_ids) -> {'round', 'call', 'blobs'}
  or None` reach the central node (`env_snapshot`, `resume_envs`)."""

  def __init__(self, env_ids: Sequence[int], unroll_length: int, every_rounds: int,
               send: Callable[..., Any], fetch: Callable[[List[int]], Any]):
    self.env_ids = [int(i) for i in env_ids]
    self._unroll_length, self._every = int(unroll_length), int(every_rounds)
    self._send, self._fetch = send, fetch

  def resume(self, engine: Any) -> Tuple[int, Any]:
    """Restores `engine`'s envs if the central node continues from a round checkpoint
    that has them: (the call count to continue from, what the engine's `restore`
    returned); (0, None): a fresh start."""
    saved = self._fetch(self.env_ids)
    if not saved:
      return 0, None
    restore = getattr(engine, 'restore', None)
    if restore is None:
      logging.warning('Envs %d..%d: the engine cannot restore envs; starting them anew',
                      self.env_ids[0], self.env_ids[-1])
      return 0, None
    restored = restore(list(saved['blobs']))
    logging.info('Envs %d..%d restored at round %d (call %d)', self.env_ids[0],
                 self.env_ids[-1], saved['round'], saved['call'])
    return int(saved['call']), restored

  def maybe_save(self, call_index: int, engine: Any) -> None:
    """Before request `call_index`: at a checkpoint round's first call, the envs'
    snapshot (or why there is none) to the central node."""
    r = checkpoint_round(call_index, self._unroll_length, self._every)
    if r is None:
      return
    snapshot = getattr(engine, 'snapshot', None)
    try:
      if snapshot is None:
        raise TypeError(f'engine {type(engine).__name__} cannot snapshot its envs')
      blobs = snapshot()
    except Exception as e:  # pylint: disable=broad-except
      why = f'envs {self.env_ids[0]}..{self.env_ids[-1]}: {e}'
      logging.warning('Round %d checkpoint without these envs: %s', r, why)
      self._send(r, self.env_ids, None, why)
      return
    self._send(r, self.env_ids, blobs, None)

