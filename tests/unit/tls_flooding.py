"""A stranger that opens TCP connections to an endpoint as fast as it can (issue 62).

    python -m tests.unit.tls_flooding --source 10.77.0.5 --seconds 30 --mode hold \
        --out flood.json 10.77.0.2:7001 10.77.0.2:7000

What the run's TLS endpoint (`seedacme.wire.tls_tunnel`) must outlast without starving
its own peers; `tests/unit/test_tls_flood.py` (loopback) and
`tests/integration/test_tls_flood.py` (a stranger emulated host beside a run) start
several of these, one per mode:

  hold   opens connections, sends nothing and keeps them (up to `--hold` at once,
         the oldest closed first): each costs the endpoint a descriptor until it ends it
  churn  opens and closes at once
  junk   opens, sends a few KB of junk (no TLS record), closes
  hello  opens and starts TLS without a certificate (the endpoint does its share of a
         handshake's crypto before it can refuse)

Blocking connects with a short timeout, round-robin over the targets. Writes what it
managed (connections, failures by kind) as JSON to `--out` at the end.
"""

import argparse
import collections
import errno
import json
import os
import resource
import socket
import ssl
import sys
import time


def _open(target, source: str | None, timeout_s: float) -> socket.socket:
  sock = socket.socket(socket.AF_INET6 if ':' in target[0] else socket.AF_INET)
  try:
    sock.settimeout(timeout_s)
    if source:
      sock.bind((source, 0))
    sock.connect(target)
    return sock
  except BaseException:
    sock.close()
    raise


def flood(targets, source: str | None, mode: str, seconds: float, hold: int) -> dict:
  """Connections to `targets` for `seconds` in `mode` (module docstring); counts."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft < hard:  # as many descriptors of our own as we may have
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
  hello = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
  hello.check_hostname, hello.verify_mode = False, ssl.CERT_NONE
  junk = os.urandom(4096)
  held = collections.deque()
  counts = collections.Counter()
  end = time.monotonic() + seconds
  i = 0
  while time.monotonic() < end:
    target = targets[i % len(targets)]
    i += 1
    try:
      sock = _open(target, source, 1.0)
    except OSError as e:
      counts[f'connect_{errno.errorcode.get(e.errno, type(e).__name__)}'] += 1
      if e.errno in (errno.EMFILE, errno.ENFILE) and held:
        held.popleft().close()
      continue
    counts['connected'] += 1
    try:
      if mode == 'hold':
        held.append(sock)
        while len(held) > hold:
          held.popleft().close()
        continue
      if mode == 'junk':
        sock.sendall(junk)
      elif mode == 'hello':
        sock.settimeout(2.0)
        try:
          hello.wrap_socket(sock, server_hostname=target[0]).close()
        except (ssl.SSLError, OSError) as e:
          counts[f'tls_{type(e).__name__}'] += 1
    except OSError as e:
      counts[f'io_{type(e).__name__}'] += 1
    sock.close()
  for sock in held:
    sock.close()
  return dict(counts, mode=mode, seconds=seconds)


def main(argv) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('targets', nargs='+', help='host:port')
  parser.add_argument('--source', default=None, help='the address to connect from')
  parser.add_argument('--mode', choices=('hold', 'churn', 'junk', 'hello'), default='hold')
  parser.add_argument('--seconds', type=float, default=30.0)
  parser.add_argument('--hold', type=int, default=4000,
                      help='hold: connections kept open at most')
  parser.add_argument('--out', default=None)
  args = parser.parse_args(argv)
  targets = []
  for entry in args.targets:
    host, _, port = entry.rpartition(':')
    targets.append((host.strip('[]'), int(port)))
  counts = flood(targets, args.source, args.mode, args.seconds, args.hold)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(counts, f)
  print(json.dumps(counts), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
