"""Start-up phase marks: one log line per phase a process reaches, timed from its start.

Issue 48 ("measure first"): a program takes seconds from the launch command to its
first env step, spread over several processes (launcher, replay, central node, actors)
that each import, build and wait. `mark(node, phase)` logs one line

    startup: learner tf_imported +4.21s (at 1795863792.491, pid 1234)

`+4.21s` is the time since *this process* started, read from the kernel
(`/proc/self/stat` field 22, the start time in clock ticks since boot), so it counts
the interpreter's start and every import before the first line of our code ran --
seconds no in-process timer sees. `at` is the unix time of the mark, so the lines of
every process (several per node log: a supervisor and its child) go on one timeline;
`pid` tells a supervisor's lines from its child's. `bench/startup.py` parses them.

Why shaped so: it must be cheap and safe at import time of any node -- no TensorFlow,
nothing but the standard library and absl's logging, which every node already uses --
and it never raises: a mark that cannot read /proc logs its line without `+seconds`.
The age is taken against `CLOCK_BOOTTIME` (the clock `starttime` counts on), not
`btime` from /proc/stat, which is whole seconds and would put up to 1 s of error into
every `+seconds`; `btime` is the fallback where that clock is missing. A process that
cannot log through absl yet (the launcher: absl's INFO is off before flags are parsed)
prints `line(...)` itself.
"""

import os
import re
import time

from absl import logging

PREFIX = 'startup:'
# `startup: <node> <phase> [+<s>s ](at <unix time>[, pid <pid>])`
LINE_RE = re.compile(r'startup: (?P<node>\S+) (?P<phase>\S+) (?:\+(?P<since>[0-9.]+)s )?'
                     r'\(at (?P<at>[0-9.]+)(?:, pid (?P<pid>\d+))?\)')

# Where a process's start time is read (`starttime`, field 22); a test points it elsewhere.
STAT_PATH = '/proc/self/stat'
_start = None  # (pid, path, CLOCK_BOOTTIME seconds at this process's start), once per pid


def _start_boottime() -> float:
  """Seconds since boot at which this process started (`starttime`, field 22)."""
  with open(STAT_PATH, 'rb') as f:
    stat = f.read()
  # The command name (field 2) may hold spaces or parentheses: count after its ')'.
  fields = stat[stat.rindex(b')') + 2:].split()
  return int(fields[22 - 3]) / os.sysconf('SC_CLK_TCK')


def _boot_time() -> float:
  """Unix time of boot, from /proc/stat (whole seconds)."""
  with open('/proc/stat') as f:
    for row in f:
      if row.startswith('btime '):
        return float(row.split()[1])
  raise ValueError('no btime in /proc/stat')


def process_age() -> float | None:
  """Seconds since this process started (interpreter start and imports included), or
  None when /proc cannot tell."""
  global _start
  try:
    pid = os.getpid()
    if _start is None or _start[:2] != (pid, STAT_PATH):  # a forked child: its own start
      _start = (pid, STAT_PATH, _start_boottime())
    if hasattr(time, 'CLOCK_BOOTTIME'):
      return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - _start[2])
    return max(0.0, time.time() - _boot_time() - _start[2])
  except Exception:  # pylint: disable=broad-except  (never in the way of a start)
    return None


def line(node: str, phase: str) -> str:
  """The mark's text: `startup: <node> <phase> +<age>s (at <unix time>, pid <pid>)`."""
  try:
    age = process_age()
    since = '' if age is None else f'+{age:.2f}s '
    return f'{PREFIX} {node} {phase} {since}(at {time.time():.3f}, pid {os.getpid()})'
  except Exception:  # pylint: disable=broad-except
    return f'{PREFIX} {node} {phase}'


def mark(node: str, phase: str) -> None:
  """Logs (absl INFO) that process `node` reached `phase` now; never raises."""
  try:
    logging.info('%s', line(node, phase))
  except Exception:  # pylint: disable=broad-except
    pass
