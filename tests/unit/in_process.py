"""An env-only actor that calls a central node in this process: what the in-process
program tests (conftest's `make_central`, the reproducible-run tests) drive it with."""

import threading

import numpy as np

from seedacme.actor.engines import BatchedEnv
from seedacme.run.resume import ActorSnapshots
from seedacme.wire.protocol import make_request


class InProcessActor(threading.Thread):
  """An env-only actor (or with `mode=Mode.EVAL` an evaluator) calling the central node
  in-process; it ends when told to stop or when the server says it is shutting down (a
  reproducible run's budget met at a round's start)."""

  def __init__(self, central, factory, first_env_id, num_envs, stop, mode=None,
               snapshots=None):
    """`snapshots`: (unroll length, checkpoint_rounds) of a reproducible run with
    round checkpoints: the envs are handed in at checkpoint rounds and restored on a
    resume, as `EnvActor` does (`seedacme.run.resume.ActorSnapshots`)."""
    super().__init__(daemon=True)
    self.central, self.stop, self.mode = central, stop, mode
    self.envs = BatchedEnv(factory, num_envs, seed=first_env_id)
    self.env_ids = np.arange(first_env_id, first_env_id + num_envs)
    self.snapshots = None if snapshots is None else ActorSnapshots(
        self.env_ids, *snapshots, send=central.env_snapshot, fetch=central.resume_envs)
    self.steps = 0
    self.error = None

  def run(self):
    try:
      restored = None
      if self.snapshots is not None:
        self.steps, restored = self.snapshots.resume(self.envs)
      ts = restored if restored is not None else self.envs.reset()
      while not self.stop.is_set():
        if self.snapshots is not None:
          self.snapshots.maybe_save(self.steps, self.envs)
        mode = () if self.mode is None else (self.mode,)
        reply = self.central.step(make_request(
            self.env_ids, np.full(len(self.env_ids), 1), ts.observation,
            ts.reward, ts.discount, ts.step_type, *mode))
        if 'shutting_down' in reply:
          return
        ts = self.envs.step(reply['action'])
        self.steps += 1
    except Exception as e:  # noqa: BLE001
      if not self.stop.is_set():
        self.error = e


def run_to_its_end(central, actors, logdir, busy: int = 0):
  """Runs an in-process reproducible program until it ends itself (a budget met at a
  round's start), `busy` busy-looping processes beside it; checks that no actor failed
  and returns the run's round records (`<logdir>/rounds.jsonl`)."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  loops = [subprocess.Popen([sys.executable, '-c', 'while True: pass'])
           for _ in range(busy)]
  try:
    for a in actors:
      a.start()
    central.run()
  finally:
    for p in loops:
      p.kill()
      p.wait()
  assert all(a.error is None for a in actors), [a.error for a in actors]
  with open(os.path.join(logdir, 'rounds.jsonl')) as f:
    return [json.loads(line) for line in f]
