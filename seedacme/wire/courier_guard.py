"""Courier rebuilds one name in a seedacme process: a peer's payload cannot run code,
and no message Courier's client can send makes the deserializer fail.

Courier 0.5 turns a value it does not know natively (anything but None, bools, numbers,
strings, bytes, lists, tuples and dicts) into a "reduced object": the module and name
of a callable plus its arguments, i.e. `__reduce__`. The receiving side
(`courier/serialization/py_serialize.cc`, `ImportClass` then `PyObject_CallObject`)
imports that module, takes that attribute and calls it, before any handler of ours
runs, and does not check the call's result: a payload naming `os.mkdir` created a
directory on the serving node, and any constructor given bad arguments (`complex('x')`)
ended the process with SIGSEGV. numpy's own pickle names are no safer: `dtype`'s
`__setstate__` takes forged flags, and with `_reconstruct` an object array was filled
from a caller's bytes (issue 47). So names cannot be made safe one by one: between
hosts nothing of a peer reaches Courier before mutual TLS (`seedacme.wire.tls_tunnel`),
and inside, this guard leaves Courier nothing to rebuild.

* **seedacme's wire has no reduced objects.** `plain` turns what seedacme sends into
  Courier's native types: an array of numbers or bools as `(_ARRAY_TAG, dtype, shape,
  bytes)`, other arrays and sets as lists, numpy scalars as Python numbers; `accept`
  on the other side turns the arrays back (a numeric dtype from a fixed table, a shape
  whose bytes match) and refuses anything else by name. Recorded before `plain`: seedacme's
  traffic made Courier rebuild numpy's `_reconstruct`, `ndarray`, `dtype` and `scalar`
  (Courier 0.5 pickles arrays and numpy scalars) and nothing else. Recorded with it
  (`SEEDACME_COURIER_RECORD=<file>` appends each name Courier asks a guarded process
  for, allowed or refused, server or client side): 30 s runs of vtrace (default
  transport, `--transport courier`, `--inference actor`), r2d2 and ppo on cartpole and
  sac on InvertedPendulum, every node: no name at all; a handler that raises (the
  central node refusing a request, `test_courier_guard.py`): `traceback.format_exception`
  on the server side, asked again at each error.
* **One name passes, wrapped.** Courier's server formats a handler's exception with
  `traceback.format_exception`, which it imports the same way; that is the allow-list
  (`ALLOWED`). It is handed over as a function that cannot fail (an exception gives the
  inert stand-in) and whose result takes Courier's rebuilding steps (`__setstate__`,
  `extend`, item assignment) as no-ops.
* **Everything else gets a stand-in.** `install()` wraps `builtins.__import__`. The call
  Courier's deserializer makes (`PyImport_Import`: an empty *list* as `fromlist`, the
  same dict as globals and locals; no Python import statement calls it so) from where
  Courier makes it (no Python frame on the thread: a server thread; or Courier's own
  `client.py`, or `courier_futures`, whose threads make a client's `futures` calls:
  on Courier's async path some replies abort the process) imports no module that no allowed
  name lives in, and puts a gate in `sys.modules[name]` for the attribute read that
  follows, until every Courier import that got it has made its read -- for any entry
  there, module or not (Python 3.10 keeps classes in
  `sys.modules`: `typing.io`; issue 47 reached `exec` through one). A name not allowed
  gets an inert stand-in that Courier calls and rebuilds as a `RefusedPayload`; a gate
  another thread catches in its window answers a Python import statement there with the
  real attribute and Courier's deserializer with the allow-list. Raising in the import
  instead would reach the caller as Courier's anonymous "ToUtilStatus failure." and
  leave the Python error set on the handler thread; with the stand-in the message
  completes and `accept`/`check` raise `RefusedPayloadError` naming what was sent.
  Courier caches what it got for a name for the life of the process (its key and our
  stand-in): a peer sending distinct names grows the process by each name's length
  (measured: 2,000 refused 4,000-char names, +9.1 KB a name before, +4.9 KB now that
  the stand-in keeps 120 characters and 64 names are logged at most).
* **The interpreter's crash printers run under a Python frame.** Its own traceback
  printer (C: `sys.__excepthook__` for an uncaught exception at the top level,
  `sys.__unraisablehook__` for a `_thread` thread's or a `__del__`'s) imports `io` the
  way Courier's deserializer does, and at the top level or on a thread `_thread`
  started no Python frame is on the thread: it got a gate, a stand-in for `io.open`,
  and the traceback stopped before its exception line (a node's crash had no cause in
  its log). `install()` puts those two hooks, where still the interpreter's own, behind
  a Python function of this file that calls them: the same printer and output, and the
  import has a frame that is not Courier's. Courier's deserializer never runs under
  them, so what it gets is unchanged (`io.open` included, `test_courier_guard.py`).
  `threading`'s hook is called from `threading.py` and needs nothing. A program that
  puts the interpreter's own hook back, or C code calling its printer with no frame,
  gets the cut traceback again.
* **What no guard here can stop.** A CallRequest written by hand rather than by
  Courier's client ends the process in Courier's C++ before any Python runs (SIGSEGV,
  measured): a reduced object whose arguments are not a tuple (any name: the call
  fails, its NULL result is used), a dict with more keys than values, key/value
  pairs that are not a list followed by another reduced object (the error left set
  fails the next call). Any tensor value holds a server thread for ever (it waits in
  `CreateTensorLookup`), and is built at the shape it names (30 bytes, 512 MB). Only
  not letting a stranger's bytes reach Courier helps: the TLS endpoint between hosts,
  loopback in a private namespace on one (`tests/unit/test_courier_raw_messages.py`).

The central node's methods (`seedacme.nodes.service`, or `served` for any handler) and
actors' replies (`seedacme.actor.transport`) go through `accept`/`plain`. A plain
Courier client (without `plain`) that sends a numpy array gets an error: its array is
a reduced object now. Cost (timeit, K=16 Catch request, load ~9 on 2 cores): `plain`
~30 us, `accept` ~33 us (a first `accept`, a check walk then a decode walk with
`np.prod` per array, took 181 us); an `import` statement anywhere in the process goes
through one Python call (+0.16 us, timeit).

Why ~480 lines: two halves that must agree and sit together -- the wire (`plain`,
`accept`, the array table) and the import gate with its stand-ins -- each small, plus
the reasons above, which are the part a reader needs.
"""

import builtins
import importlib
import os
import sys
import threading
import types
from typing import FrozenSet, Tuple

from absl import logging
import numpy as np

from seedacme.wire import courier_futures
from seedacme.wire.protocol import InvalidRequestError

# The one name Courier rebuilds in a seedacme process (see the docstring): its
# server formats a handler's exception with it. Handed over wrapped (`_safe_for`).
ALLOWED: FrozenSet[Tuple[str, str]] = frozenset({('traceback', 'format_exception')})
_ALLOWED_MODULES = frozenset(module for module, _ in ALLOWED)


class RefusedPayloadError(InvalidRequestError):
  """A Courier message carried an object this process does not rebuild."""


class RefusedType(RefusedPayloadError, ImportError):
  """Raised when code touches a `RefusedPayload` (a refused object's stand-in)."""


class _Inert:
  """Courier's rebuilding steps after the call (`__setstate__`, `extend`, item
  assignment), as no-ops: on what the guard hands back they cannot fail."""
  __slots__ = ()

  def __setstate__(self, state) -> None:
    del state

  def extend(self, items) -> None:
    del items

  def __setitem__(self, key, value) -> None:
    del key, value


class RefusedPayload(_Inert):
  """What a refused object is rebuilt as: inert (`_Inert`), names what was sent;
  anything else raises `RefusedType`."""
  __slots__ = ('what',)

  def __init__(self, what: str):
    object.__setattr__(self, 'what', what)

  def __getattr__(self, name: str):
    raise RefusedType(_message(object.__getattribute__(self, 'what')))

  def __repr__(self) -> str:
    return f'<refused {object.__getattribute__(self, "what")}>'


class _StandIn:
  """Takes the refused callable's place: calling it builds a `RefusedPayload`."""
  __slots__ = ('what',)

  def __init__(self, what: str):
    self.what = what

  def __call__(self, *args, **kwargs) -> RefusedPayload:
    del args, kwargs
    return RefusedPayload(self.what)


class _Lines(_Inert, list):
  """What the wrapped `format_exception` returns: a list of strings on which Courier's
  rebuilding steps cannot fail (`_Inert`)."""

  __hash__ = object.__hash__  # usable as a dict key a payload puts it in


# The dtypes an array may travel with: numbers and bools, little-endian.
_DTYPES = {np.dtype(c).newbyteorder('<').str: np.dtype(c).newbyteorder('<')
           for c in '?bhilqBHILQefd'}
_MAX_ARRAY_BYTES = 1 << 30
_ARRAY_TAG = b'\x00seedacme.ndarray'


def _format_exception(*args, **kwargs) -> _Lines:
  import traceback  # pylint: disable=g-import-not-at-top
  return _Lines(str(line) for line in traceback.format_exception(*args, **kwargs))


def _safe_for(name: str, attr: str):
  """What Courier gets for allowed `name.attr`: a function that checks its arguments
  and cannot fail (Courier does not check the call's result: an exception there was a
  SIGSEGV); a failed call gives the inert stand-in. It carries the real one's module
  and name, since numpy's own pickling (Courier's serializer, sending an array)
  looks `_reconstruct` and `scalar` up through the same import and sends them by name."""
  if (name, attr) in _SAFE:  # one object per name: Courier's serializer checks that
    return _SAFE[(name, attr)]  # the name it sends resolves to the object it has
  real = {'format_exception': _format_exception}[attr]

  def safe(*args, **kwargs):
    try:
      return real(*args, **kwargs)
    except BaseException:  # pylint: disable=broad-except
      return RefusedPayload(f'{name}.{attr} (called with arguments it refused)')

  safe.__module__, safe.__name__, safe.__qualname__ = name, attr, attr
  return _SAFE.setdefault((name, attr), safe)


_SAFE = {}


def plain(value, depth: int = 0):
  """`value` as seedacme sends it over Courier: only types Courier carries natively.
  An array of numbers or bools travels as `(_ARRAY_TAG, dtype, shape, bytes)` (Courier
  would pickle it, and the receiver would have to rebuild numpy's constructors, whose
  `__setstate__` takes forged dtype flags); other arrays and sets as lists, numpy
  scalars as Python numbers. `accept` on the receiving side turns it back."""
  kind = type(value)
  if kind in _PLAIN:
    return value
  if isinstance(value, np.ndarray):
    if value.dtype.kind in 'biuf':
      dtype = value.dtype.newbyteorder('<') if value.dtype.byteorder == '>' else value.dtype
      return (_ARRAY_TAG, dtype.str, tuple(int(n) for n in value.shape),
              np.ascontiguousarray(value, dtype).tobytes())
    return plain(value.tolist(), depth + 1)
  if isinstance(value, np.generic):
    return value.item()
  if depth > 32:
    raise ValueError('a message nested deeper than 32 levels')
  if isinstance(value, dict):
    return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
  if isinstance(value, (list, set, frozenset)):
    return [plain(v, depth + 1) for v in value]
  if isinstance(value, tuple):
    return tuple(plain(v, depth + 1) for v in value)
  return value


def _array(value: tuple) -> np.ndarray | str:
  """The array a tagged tuple carries, or why it is refused."""
  if len(value) != 4:
    return 'a malformed array'
  _, dtype, shape, data = value
  dtype = _DTYPES.get(dtype) if type(dtype) is str else None
  if (dtype is None or type(shape) is not tuple or type(data) is not bytes
      or not all(type(n) is int and 0 <= n for n in shape)):
    return f'an array of dtype {value[1]!r:.40}' if dtype is None else 'a malformed array'
  size = dtype.itemsize
  for n in shape:
    size *= n
  if size > _MAX_ARRAY_BYTES or len(data) != size:
    return 'an array whose bytes do not match its shape'
  return np.frombuffer(bytearray(data), dtype).reshape(shape)


def _message(what: str) -> str:
  return (f'refused to rebuild {what} from a Courier message: seedacme accepts only '
          'numpy arrays, numbers, strings, bytes, lists, tuples and dicts')


_lock = threading.Lock()
_gate_lock = threading.RLock()  # a gate's state and its place in sys.modules
_real_import = None
_refused_logged = set()
# Files whose frames call Courier's client (its own; `courier_futures`'s pool threads).
_courier_client_files = frozenset()
# Courier caches each name it rebuilt for the life of the process, so a peer can add
# one entry per distinct name it sends: what the guard keeps per name is bounded.
_MAX_NAME_CHARS = 120
_MAX_LOGGED = 64
RECORD_VAR = 'SEEDACME_COURIER_RECORD'
_record_path = None


def _record(name: str, attr: str, allowed: bool) -> None:
  """Appends one line to `$SEEDACME_COURIER_RECORD` (the recording mode that measured
  `ALLOWED`): the name, allowed or refused, which side asked (a server thread has no
  Python frame; a client call does), the pid and the program. Never raises."""
  try:
    side = 'client' if sys._getframe(2) else 'server'  # 2: who read the attribute
  except ValueError:
    side = 'server'
  line = '\t'.join((f'{name}.{attr}', 'allowed' if allowed else 'refused', side,
                    str(os.getpid()), ' '.join(sys.argv)[:200])) + '\n'
  try:
    fd = os.open(_record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
      os.write(fd, line.encode('utf-8', 'backslashreplace'))
    finally:
      os.close(fd)
  except OSError:
    pass


def _refuse(what: str) -> _StandIn:
  what = what if len(what) <= _MAX_NAME_CHARS else what[:_MAX_NAME_CHARS] + '...'
  if len(_refused_logged) < _MAX_LOGGED and what not in _refused_logged:
    _refused_logged.add(what)
    logging.warning('seedacme: %s%s', _message(what), '' if len(_refused_logged) <
                    _MAX_LOGGED else ' (further refused names are not logged)')
  return _StandIn(what)


# Leaves a payload carries by the thousand: no refused object can hide in them.
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})


def find_refused(value, depth: int = 0) -> str | None:
  """What `value` (a rebuilt Courier payload) carries that is refused, or None: a
  stand-in, an array that is not `plain`'s, a type Courier only rebuilds through a
  constructor, or a nest deeper than 32."""
  kind = type(value)
  if kind in _PLAIN:
    return None
  if kind is RefusedPayload or kind is _StandIn:
    return object.__getattribute__(value, 'what')
  if kind is np.ndarray:  # Courier's own tensors: numbers and bools only
    return None if value.dtype.kind in 'biuf' else f'an array of dtype {value.dtype}'
  if depth > 32:
    return 'a message nested deeper than 32 levels'
  if kind is dict:
    items = (x for pair in value.items() for x in pair)
  elif kind is tuple and value and value[0] == _ARRAY_TAG:
    found = _array(value)
    return found if isinstance(found, str) else None
  elif kind is list or kind is tuple or kind is _Lines:
    items = value
  else:  # nothing else is rebuilt from seedacme's own traffic
    return f'an object of type {kind.__module__}.{kind.__qualname__}'
  for item in items:
    if type(item) in _PLAIN:
      continue  # what `find_refused(item)` would say, without the call
    found = find_refused(item, depth + 1)
    if found:
      return found
  return None


class _Refused(Exception):
  pass


def _decode(value, depth: int = 0):
  """`value` with `plain`'s arrays as ndarrays; raises `_Refused(what)` for anything
  `find_refused` would name (one walk: `accept` is on every request's path)."""
  kind = type(value)
  if kind in _PLAIN:
    return value
  if kind is dict:
    if depth < 32:
      return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in value.items()}
  elif kind is tuple and value and value[0] == _ARRAY_TAG:
    array = _array(value)
    if type(array) is not str:
      return array
    raise _Refused(array)
  elif kind is list or kind is _Lines or kind is tuple:
    if depth < 32:
      items = [_decode(v, depth + 1) for v in value]
      return tuple(items) if kind is tuple else items
  elif kind is np.ndarray and value.dtype.kind in 'biuf':
    return value
  found = find_refused(value, depth)
  raise _Refused(found or 'a message nested deeper than 32 levels')


def accept(value, where: str):
  """`value` as handlers use it (`plain`'s arrays as ndarrays again); raises
  `RefusedPayloadError` naming `where` when it carries anything refused."""
  try:
    return _decode(value)
  except _Refused as e:
    raise RefusedPayloadError(f'{where}: {_message(str(e))}') from None


def served(handler, name: str):
  """`handler` as a Courier method of seedacme's wire: arguments through `accept`, the
  result through `plain` (`seedacme.nodes.service` serves the central node so)."""

  def method(*args):
    return plain(handler(*accept(args, name)))

  method.__name__ = name
  return method


def check(value, where: str) -> None:
  """Raises `RefusedPayloadError` naming `where` when `value` carries a refused object
  (a handler's arguments, a reply), so the caller gets a named error."""
  found = find_refused(value)
  if found:
    raise RefusedPayloadError(f'{where}: {_message(found)}')


class _Gate(types.ModuleType):
  """Stands in `sys.modules[name]` until each Courier import that returned it has made
  its one attribute read (`PyImport_Import` reads `sys.modules` again after the hook
  returns: a gate one thread put back while another was in that window would hand the
  second the real module); `module` is None when the module was never imported."""

  def __init__(self, name: str, module: types.ModuleType | None, thread: int):
    super().__init__(name)
    # name, module, the arming thread, Courier reads still to come
    object.__setattr__(self, '_seedacme_gate', [name, module, thread, 1])

  def __getattribute__(self, attr: str):
    state = object.__getattribute__(self, '_seedacme_gate')
    name, module, thread, _ = state
    # Another thread caught the gate in its window: a Python import statement there
    # gets the real attribute; Courier's deserializer on another thread (no Python
    # frame above this one, or Courier's client module) is held to the allow-list.
    caller = sys._getframe(1) if sys._getframe(0).f_back is not None else None
    courier = (threading.get_ident() == thread or caller is None
               or caller.f_code.co_filename in _courier_client_files)
    with _gate_lock:
      if courier:
        state[3] -= 1
      if state[3] <= 0 and sys.modules.get(name) is self:
        if module is None:
          del sys.modules[name]
        else:
          sys.modules[name] = module
    if not courier:
      return getattr(module or importlib.import_module(name), attr)
    allowed = module is not None and (name, attr) in ALLOWED
    if _record_path:
      _record(name, attr, allowed)
    if not allowed:
      return _refuse(f'{name}.{attr}')
    return _safe_for(name, attr)


def _from_courier() -> bool:
  """Whether the import being made comes from Courier's deserializer (see the module
  docstring): no Python frame under the hook, or Courier's client module's frame."""
  try:
    caller = sys._getframe(2)  # 0: this function, 1: the hook, 2: who imported
  except ValueError:
    return True
  return caller.f_code.co_filename in _courier_client_files


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # pylint: disable=redefined-builtin
  if (type(fromlist) is list and not fromlist and level == 0 and locals is globals
      and _from_courier()):
    if name in _ALLOWED_MODULES:
      _real_import(name, globals, locals, fromlist, level)
    with _gate_lock:
      module = sys.modules.get(name)
      if isinstance(module, _Gate):  # armed by another thread: one more read to come
        object.__getattribute__(module, '_seedacme_gate')[3] += 1
        return module
      # Any entry, module or not (Python 3.10 keeps classes there: `typing.io`), is gated.
      sys.modules[name] = gate = _Gate(name, module, threading.get_ident())
      return gate
  return _real_import(name, globals, locals, fromlist, level)


# The interpreter's own crash printers, called from a Python frame (see the docstring).
def _excepthook(exc_type, value, tb, _printer=sys.__excepthook__) -> None:
  _printer(exc_type, value, tb)


def _unraisablehook(unraisable, _printer=sys.__unraisablehook__) -> None:
  _printer(unraisable)


def _print_crashes_under_a_frame() -> None:
  """Where `sys.excepthook` and `sys.unraisablehook` are still the interpreter's own,
  puts them behind `_excepthook`/`_unraisablehook`: the same printers, run from a Python
  frame of this file, so the `io` they import is the module, not a gate."""
  if sys.excepthook is sys.__excepthook__:
    sys.excepthook = _excepthook
  if sys.unraisablehook is sys.__unraisablehook__:
    sys.unraisablehook = _unraisablehook


def install() -> None:
  """Puts the guard in place for this process (idempotent). Call before the first
  Courier server or client of the process is used."""
  global _real_import, _courier_client_files, _record_path
  with _lock:
    if _real_import is not None:
      return
    _print_crashes_under_a_frame()
    _record_path = os.environ.get(RECORD_VAR) or None
    from courier.python import client as courier_client  # pylint: disable=g-import-not-at-top
    # Courier's futures would end this process on some replies (`courier_futures`).
    courier_futures.install()
    _courier_client_files = frozenset({courier_client.__file__, courier_futures.__file__})
    _real_import = builtins.__import__
    builtins.__import__ = _guarded_import
