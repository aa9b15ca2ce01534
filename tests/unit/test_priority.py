"""`acting_nice`: actor processes lower their CPU priority, every thread of them."""

import subprocess
import sys
import textwrap

import pytest

from seedacme.config import ProgramConfig

_CHILD = textwrap.dedent('''
    import os, threading
    from seedacme.runtime.priority import lower_process_priority
    started, release = threading.Event(), threading.Event()
    tid = []
    def worker():
      tid.append(threading.get_native_id()); started.set(); release.wait(30)
    t = threading.Thread(target=worker); t.start(); started.wait(30)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    after = lower_process_priority(7)
    late = []
    t2 = threading.Thread(target=lambda: late.append(os.getpriority(os.PRIO_PROCESS, 0)))
    t2.start(); t2.join()
    print(before, after, os.getpriority(os.PRIO_PROCESS, tid[0]), late[0],
          lower_process_priority(0))
    release.set(); t.join()
''')


def test_every_thread_now_and_later_is_reniced():
  out = subprocess.run([sys.executable, '-c', _CHILD], capture_output=True, text=True,
                       timeout=60, check=True)
  before, after, other_thread, later_thread, unchanged = map(int, out.stdout.split())
  assert after == min(19, before + 7)
  assert other_thread == after  # a thread that existed before
  assert later_thread == after  # a thread started after inherits it
  assert unchanged == 0  # 0: nothing done


def test_bad_niceness_is_refused_naming_the_field():
  with pytest.raises(ValueError, match='acting_nice'):
    ProgramConfig(acting_nice=20).validate()
  with pytest.raises(ValueError, match='acting_nice'):
    ProgramConfig(acting_nice=-1).validate()
