"""Cross-process wake-ups for the same-host data path: eventfd, pipe, Unix socket.

    .venv/bin/python bench/wakeup.py [--round_trips 20000]

Two processes exchange one wake-up each way per round trip (the shape of one inference
request on the shared-memory path: the actor wakes the server, the server wakes the
actor), with K=16 Catch observations written into shared memory before each wake-up.
Per mechanism: round trips/s and CPU per round trip on each side. The choice it decided
(`seedacme/wire/shm.py`): a Unix stream socket, which costs about what an eventfd costs
and also tells each side when the other dies (EOF), and carries the file descriptors of
the segment at attach (SCM_RIGHTS). Prints a table, writes bench/results/wakeup.json.
"""

import argparse
import json
import os
import resource
import socket
import sys
import time

import numpy as np

from harness import machine, print_table, write_json


def _pair(kind):
  """(parent's send, parent's recv, child's send, child's recv) callables + closers."""
  if kind == 'eventfd':
    a, b = os.eventfd(0), os.eventfd(0)
    return ((lambda: os.eventfd_write(a, 1)), (lambda: os.eventfd_read(b)),
            (lambda: os.eventfd_write(b, 1)), (lambda: os.eventfd_read(a)))
  if kind == 'pipe':
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    return ((lambda: os.write(w1, b'x')), (lambda: os.read(r2, 1)),
            (lambda: os.write(w2, b'x')), (lambda: os.read(r1, 1)))
  if kind in ('unix_socket', 'unix_socket_timeout'):
    s1, s2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if kind == 'unix_socket_timeout':  # what ShmTransport does: recv waits in slices
      s1.settimeout(0.2)
    return ((lambda: s1.send(b'x')), (lambda: s1.recv(1)),
            (lambda: s2.send(b'x')), (lambda: s2.recv(1)))
  raise ValueError(kind)


def measure(kind: str, round_trips: int, k: int = 16) -> dict:
  from multiprocessing import shared_memory  # pylint: disable=g-import-not-at-top
  shm = shared_memory.SharedMemory(create=True, size=k * 50 * 4 + k * 4)
  try:
    obs = np.ndarray((k, 50), np.float32, shm.buf)
    act = np.ndarray((k,), np.int32, shm.buf, k * 50 * 4)
    send, recv, child_send, child_recv = _pair(kind)
    pid = os.fork()
    if pid == 0:
      for _ in range(round_trips):
        child_recv()
        act[:] = obs[:, 0].astype(np.int32)
        child_send()
      os._exit(0)
    x = np.random.rand(k, 50).astype(np.float32)
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(round_trips):
      obs[:] = x
      send()
      recv()
      _ = act.copy()
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    os.waitpid(pid, 0)
    rc = resource.getrusage(resource.RUSAGE_CHILDREN)
    del obs, act
  finally:
    shm.close()
    shm.unlink()
  return {'mechanism': kind, 'K': k, 'round_trips_per_s': round_trips / dt,
          'us_per_round_trip': dt / round_trips * 1e6,
          'client_cpu_us': (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                           / round_trips * 1e6,
          'server_cpu_us': (rc.ru_utime + rc.ru_stime) / round_trips * 1e6}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--round_trips', type=int, default=20000)
  args = parser.parse_args()
  rows = []
  for kind in ('eventfd', 'pipe', 'unix_socket', 'unix_socket_timeout'):
    # Each in a fresh child so RUSAGE_CHILDREN counts only its own server side.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(r)
      os.write(w, json.dumps(measure(kind, args.round_trips)).encode())
      os._exit(0)
    os.close(w)
    data = b''
    while chunk := os.read(r, 4096):
      data += chunk
    os.waitpid(pid, 0)
    rows.append(json.loads(data))
  print_table(rows, ['mechanism', 'K', 'round_trips_per_s', 'us_per_round_trip',
                     'client_cpu_us', 'server_cpu_us'])
  path = write_json('wakeup.json', {'machine': machine(), 'rows': rows})
  print(f'wakeup: wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
