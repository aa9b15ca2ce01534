"""Stand-ins for a central node's callers and surface, shared by unit tests.

`InProcessClient`: the central node's Courier surface (`step`, `shm_offer(pid)`) in
this process, answering through completed futures as Courier's `client.futures` does.
`act`: an env-only actor on a thread, stepping envs against a real `CentralNode` until
it stops serving.
"""

from concurrent import futures

import numpy as np

from seedacme.actor.engines import BatchedEnv
from seedacme.wire.protocol import make_request


class InProcessClient:
  """The central node's Courier surface, in-process: `step` and `shm_offer(pid)`."""

  def __init__(self, server, shm_server):
    self.futures = self
    self.server, self.shm_server = server, shm_server
    self.rpc_steps = 0

  @staticmethod
  def _done(value):
    future = futures.Future()
    future.set_result(value)
    return future

  def step(self, request):
    self.rpc_steps += 1
    return self._done(self.server.step(request))

  def shm_offer(self, pid=None):
    return self._done(self.shm_server.offer(pid) if self.shm_server else None)


def act(central, factory, first_env_id, num_envs, stop):
  """An env-only actor in a thread, until the node stops serving."""
  env = BatchedEnv(factory, num_envs, seed=first_env_id)
  ids = np.arange(first_env_id, first_env_id + num_envs)
  ts = env.reset()
  while not stop.is_set():
    reply = central.step(make_request(ids, np.full(num_envs, 1), ts.observation, ts.reward,
                                      ts.discount, ts.step_type))
    if 'shutting_down' in reply:
      return
    ts = env.step(reply['action'])
