"""Lowering a process's CPU priority: the acting side's share against the learner's.

On a machine where actors, inference and the learner share few cores, the kernel's fair
scheduler splits the CPU by runnable threads, so a program with 2 actors x 16 envs gives
most of it to acting. `ProgramConfig.acting_nice` renices the actor and evaluator
processes so the central node's threads (inference and the learner) win when both are
runnable; measured in bench/learner_share.py (docs/benchmarks.md, "The learner's share").

Linux applies nice per thread: every thread the process has now is reniced, and threads
started later inherit it from the thread that starts them.
"""

import os

from absl import logging


def lower_process_priority(increment: int) -> int:
  """Adds `increment` (> 0) to the nice value of every thread of this process; returns
  the main thread's new nice value (0 and nothing done for `increment` <= 0)."""
  if increment <= 0:
    return 0
  try:
    tids = [int(t) for t in os.listdir('/proc/self/task')]
  except OSError:  # no procfs: the calling thread only
    tids = [0]
  for tid in tids:
    try:
      current = os.getpriority(os.PRIO_PROCESS, tid)
      os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError as e:  # the thread ended meanwhile
      logging.debug('renice of thread %d failed: %s', tid, e)
  value = os.getpriority(os.PRIO_PROCESS, 0)
  logging.info('Acting process reniced by %d (nice %d)', increment, value)
  return value
