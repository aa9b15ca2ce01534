"""A live same-host server in a process of its own (test support, not a test).

Attacks that could kill the central node (SIGBUS through a shrunk segment, issue 47)
and the fuzzer (`test_shm_fuzz.py`) must not take pytest down with it when they
succeed, and must see the server's own RSS and descriptors: so an `InferenceServer` and
`ShmServer` serve here, in `python -m tests.unit.shm_server_process [courier_port]`,
and the test drives it with JSON lines on stdin:

* `{"offer": pid}`: the `shm_offer` reply for `pid`;
* `{"stats": 1}`: `rss_kb`, `fds`, `threads`, `attached`, `served` of this process.

With a port, `shm_offer` is served over Courier too, as the central node serves it.
`ServerProcess` starts and drives it from a test.
The policy: action = round(observation[0]) + 1, observations of 3 float32, 5 actions.
"""

import json
import os
import select
import subprocess
import sys
import threading
import time

import numpy as np

from seedacme.serving.policy import PolicyStep, StatelessPolicy
from seedacme.serving.server import InferenceServer
from seedacme.serving.shm_server import ShmServer
from seedacme.types import EnvSpec

SPEC = EnvSpec((3,), 'float32', 5)
NUM_ENVS = 16


class _Policy(StatelessPolicy):

  def __init__(self, num_envs):
    super().__init__(num_envs)
    self.served = 0

  def act(self, observation, eval_mask, env_ids):
    self.served += 1
    return PolicyStep(np.clip(np.rint(np.nan_to_num(observation[:, 0])), -1, 3)
                      .astype(np.int32) + 1, {}, ())


def _stats(shm_server, policy):
  with open('/proc/self/status') as f:
    rss = next(int(line.split()[1]) for line in f if line.startswith('VmRSS:'))
  # Attached actors are counted before the descriptors: a slot is freed after its
  # descriptors close, so a count of 0 read first means none of theirs is still listed.
  attached = shm_server.attached_actors
  return {'rss_kb': rss, 'fds': len(os.listdir('/proc/self/fd')),
          'threads': threading.active_count(), 'attached': attached,
          'served': policy.served}


class ServerProcess:
  """This module in a subprocess, driven from a test: offers and stats by JSON line."""

  def __init__(self, *args):
    self.proc = subprocess.Popen([sys.executable, '-m', 'tests.unit.shm_server_process',
                                  *map(str, args)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
    self.address = self._ask(None, 60)['address']
    self._threads = self.stats()['threads']

  def _ask(self, command, timeout_s=20.0):
    if command is not None:
      self.proc.stdin.write(json.dumps(command) + '\n')
      self.proc.stdin.flush()
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
    line = self.proc.stdout.readline() if ready else ''
    assert line, f'the server process is gone (exit status {self.proc.poll()})'
    return json.loads(line)

  def offer(self, pid):
    return self._ask({'offer': pid})

  def stats(self):
    return self._ask({'stats': 1})

  def alive(self):
    return self.proc.poll() is None

  def settled_fds(self, timeout_s=5.0, expect=None):
    """Its open descriptors once no actor is attached and no hello is read (closing a
    connection on either side is not instant). With `expect`, waits (within the same
    `timeout_s`) for that count too: connections a client closed may still wait in the
    listening socket's backlog, and each is accepted, read and closed in turn (two
    descriptors over, once, in a parallel suite run at load ~2). A leak never comes
    back down; a lag does."""
    deadline = time.monotonic() + timeout_s
    while True:
      stats = self.stats()
      quiet = stats['attached'] == 0 and stats['threads'] == self._threads
      if (quiet and expect in (None, stats['fds'])) or time.monotonic() > deadline:
        return stats['fds']
      time.sleep(0.05)

  def close(self):
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(10)
    self.proc.stdin.close()
    self.proc.stdout.close()


def main(argv):
  policy = _Policy(NUM_ENVS)
  server = InferenceServer(policy, SPEC, NUM_ENVS, None, max_batch_envs=1,
                           batch_timeout_s=0.0)
  shm_server = ShmServer(server, SPEC, NUM_ENVS)
  courier_server = None
  if len(argv) > 1:
    import courier  # pylint: disable=g-import-not-at-top
    courier_server = courier.Server('shm', port=int(argv[1]))
    courier_server.Bind('shm_offer', shm_server.offer)
    courier_server.Start()
  print(json.dumps({'address': shm_server.address, 'pid': os.getpid()}), flush=True)
  for line in sys.stdin:
    command = json.loads(line)
    if 'offer' in command:
      print(json.dumps(shm_server.offer(command['offer'])), flush=True)
    else:
      print(json.dumps(_stats(shm_server, policy)), flush=True)
  if courier_server is not None:
    courier_server.Stop()
  shm_server.close()
  server.close()


if __name__ == '__main__':
  main(sys.argv)
