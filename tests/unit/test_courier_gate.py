"""The guard's import gate when two Courier imports of one module overlap.

Courier's deserializer imports with `PyImport_Import`, which calls `__import__` (the
guard's hook, which puts a gate in `sys.modules[name]`) and then reads
`sys.modules[name]` again before its attribute read. The first read on a gate used to
put the real module back at once, so a thread B whose hook ran in thread A's window
could then read the real module and any attribute of it (Courier's server imports
`traceback` this way to format an error while another thread rebuilds a message naming
`traceback.<anything>`; the GIL can switch in that window). The test plays that
interleaving with threads that, like Courier's server threads, have no Python frame:
`_thread.start_new_thread` runs a C callable (`list.extend` over `map` of
`__import__` or `getattr`) that makes the call as Courier does, and each thread is held
alive to the end (a thread's identity is part of the gate's state, and a finished
thread's is reused). On the gate before
this change B got the real module.
"""

import _thread
import builtins
import itertools
import sys
import time
import traceback

from seedacme.wire import courier_guard

_GLOBALS = {'__builtins__': builtins}  # what `PyImport_Import` passes without a frame


def _frameless(held, function, *args):
  """`function(*args)` on a new thread with no Python frame under it, as Courier's;
  the thread then waits for its lock in `held` to be released."""
  out, hold = [], _thread.allocate_lock()
  hold.acquire()
  held.append(hold)
  calls = itertools.chain(map(function, *([a] for a in args)), map(hold.acquire, [True]))
  _thread.start_new_thread(out.extend, (calls,))
  deadline = time.monotonic() + 10
  while not out and time.monotonic() < deadline:
    time.sleep(0.001)
  return out[0]


def test_a_gate_stays_until_every_courier_import_that_got_it_has_read():
  courier_guard.install()
  real, held = sys.modules['traceback'], []
  try:
    import_call = (builtins.__import__, 'traceback', _GLOBALS, _GLOBALS, [], 0)
    _frameless(held, *import_call)  # A: the hook
    _frameless(held, *import_call)  # B: the hook, in A's window
    allowed = _frameless(held, getattr, sys.modules['traceback'], 'format_exception')  # A
    b_entry = sys.modules['traceback']  # B: `PyImport_Import` reads sys.modules again
    b_attr = _frameless(held, getattr, b_entry, 'print_exc')  # B: the attribute
    b_real, restored = b_entry is real, sys.modules['traceback'] is real
  finally:
    sys.modules['traceback'] = real
    for hold in held:
      hold.release()
  assert allowed is not traceback.format_exception and allowed.__name__ == 'format_exception'
  assert not b_real, 'the real module was handed to a Courier import'
  assert b_attr is not traceback.print_exc
  assert courier_guard.find_refused(b_attr) == 'traceback.print_exc'
  assert restored  # every read made: the module is back
