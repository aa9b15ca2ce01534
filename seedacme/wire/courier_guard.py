"""Courier rebuilds only an allow-list of types: a caller's payload cannot run code.

Courier 0.5 turns a value it does not know natively (anything but None, bools, numbers,
strings, bytes, lists, tuples, dicts and arrays it sends as tensors) into a "reduced
object": the module and name of a callable plus its arguments, i.e. `__reduce__`. The
receiving side (`courier/serialization/py_serialize.cc`, `ImportClass` then
`PyObject_CallObject`) imports that module, takes that attribute and calls it, before
any handler of ours runs. A payload naming `os.mkdir` created a directory on the
serving node; on an actor, a reply does the same (anyone who takes a restarting central
node's port answers the actors).

The narrowest place to stop it in this stack is the import itself. `ImportClass` calls
`PyImport_ImportModule`, which calls `builtins.__import__(name, g, g, [], 0)` (CPython's
`PyImport_Import`: an empty *list* as `fromlist`, the same dict as globals and locals;
no Python import statement calls it so) and then reads one attribute of
`sys.modules[name]`. `install()` wraps `builtins.__import__`; for such a call made where
Courier makes it (no Python frame on the thread: a Courier server thread or a client's
completion callback; or the frame of Courier's own `client.py`: a client's synchronous
call), it does not import a module that no allowed name lives in, and puts a one-shot
gate in `sys.modules[name]` for the attribute read that follows: an allowed `(module,
name)` passes; anything else gets an inert stand-in, which Courier calls and rebuilds
as a `RefusedPayload`. Raising there instead would reach the caller as Courier's
anonymous "ToUtilStatus failure." and leave the Python error set on the handler thread;
with the stand-in the message completes, and the central node's methods
(`seedacme.nodes.service`) and actors' replies (`seedacme.actor.transport`) are checked
with `check`, which raises `RefusedPayloadError` naming what was sent. Nothing named is
called, the node keeps serving, and a refused name is logged once per process.

Allowed: what seedacme's own traffic needs and nothing that acts on the world: numpy
arrays and scalars as numpy pickles them (`_reconstruct`, `ndarray`, `dtype`,
`scalar`), `set`, `frozenset`, `complex`, and `copyreg`'s two constructors (they build
an instance of a class that is itself checked here). seedacme's wire sends only
dicts, arrays and strings (`seedacme.wire.protocol`, `seedacme.wire.reports`).

Cost: an `import` statement anywhere in the process goes through one Python call
(+0.16 us: 0.44 -> 0.60 us for `import os`, timeit); Courier's import happens once per
type per process (it caches the result); `check` of a request 3-4 us.
"""

import builtins
import importlib
import sys
import threading
import types
from typing import FrozenSet, Tuple

from absl import logging
import numpy as np

from seedacme.wire.protocol import InvalidRequestError

ALLOWED: FrozenSet[Tuple[str, str]] = frozenset({
    ('numpy', 'ndarray'),
    ('numpy', 'dtype'),
    ('numpy.core.multiarray', '_reconstruct'),
    ('numpy.core.multiarray', 'scalar'),
    # numpy's C code pickling an array on the sending side reads these two
    ('numpy.core._multiarray_umath', '_reconstruct'),
    ('numpy.core._multiarray_umath', 'dtype'),
    ('numpy.core._multiarray_umath', 'scalar'),
    ('builtins', 'set'),
    ('builtins', 'frozenset'),
    ('builtins', 'complex'),
    ('copyreg', '__newobj__'),
    ('copyreg', '_reconstructor'),
    # Courier formats a handler's exception for its caller with this
    ('traceback', 'format_exception'),
})
_ALLOWED_MODULES = frozenset({module for module, _ in ALLOWED} | {'numpy.core._exceptions'})


class RefusedPayloadError(InvalidRequestError):
  """A Courier message carried an object this process does not rebuild."""


class RefusedType(RefusedPayloadError, ImportError):
  """Raised when code touches a `RefusedPayload` (a refused object's stand-in)."""


class RefusedPayload:
  """What a refused object is rebuilt as: inert, names what was sent. Courier's own
  rebuilding steps (`__setstate__`, `extend`, item assignment) are no-ops; anything
  else raises `RefusedType`."""
  __slots__ = ('what',)

  def __init__(self, what: str):
    object.__setattr__(self, 'what', what)

  def __setstate__(self, state) -> None:
    del state

  def extend(self, items) -> None:
    del items

  def __setitem__(self, key, value) -> None:
    del key, value

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


def _message(what: str) -> str:
  return (f'refused to rebuild {what} from a Courier message: seedacme accepts only '
          'numpy arrays, numbers, strings, bytes, lists, tuples and dicts')


_lock = threading.Lock()
_real_import = None
_refused_logged = set()
_courier_client_file = None


def _refuse(what: str) -> _StandIn:
  if what not in _refused_logged:
    _refused_logged.add(what)
    logging.warning('seedacme: %s', _message(what))
  return _StandIn(what)


# Leaves a payload carries by the thousand: no refused object can hide in them.
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})


def find_refused(value, depth: int = 0) -> str | None:
  """What `value` (a rebuilt Courier payload) carries that was refused, or None.
  A request (a dict of three arrays and a string) takes 3-4 us; a first version that
  called itself on every leaf took 8-11 us (timeit, one run, load 1.1-1.9)."""
  kind = type(value)
  if isinstance(value, np.ndarray):
    if not value.dtype.hasobject:
      return None
    items = value.flat
  elif kind in _PLAIN:
    return None
  elif kind is RefusedPayload or kind is _StandIn:
    return object.__getattribute__(value, 'what')
  elif isinstance(value, dict):
    items = (x for pair in value.items() for x in pair)
  elif isinstance(value, (list, tuple, set, frozenset)):
    items = value
  else:
    return None
  if depth > 32:
    return None
  for item in items:
    leaf = type(item)
    if leaf in _PLAIN or (leaf is np.ndarray and not item.dtype.hasobject):
      continue  # what `find_refused(item)` would say, without the call
    found = find_refused(item, depth + 1)
    if found:
      return found
  return None


def check(value, where: str) -> None:
  """Raises `RefusedPayloadError` naming `where` when `value` carries a refused object
  (a handler's arguments, a reply), so the caller gets a named error."""
  found = find_refused(value)
  if found:
    raise RefusedPayloadError(f'{where}: {_message(found)}')


def _numpy_error(module: types.ModuleType, attr: str) -> bool:
  """numpy's C code reports some errors with classes it imports lazily from here."""
  value = getattr(module, attr, None)
  return (module.__name__ == 'numpy.core._exceptions' and isinstance(value, type)
          and issubclass(value, BaseException))


class _Gate(types.ModuleType):
  """Stands in `sys.modules[name]` for the one attribute read Courier makes next, on
  the thread that armed it; `module` is None when the module was never imported."""

  def __init__(self, name: str, module: types.ModuleType | None, thread: int):
    super().__init__(name)
    object.__setattr__(self, '_seedacme_gate', (name, module, thread))

  def __getattribute__(self, attr: str):
    name, module, thread = object.__getattribute__(self, '_seedacme_gate')
    if sys.modules.get(name) is self:
      if module is None:
        del sys.modules[name]
      else:
        sys.modules[name] = module
    if threading.get_ident() != thread:  # another thread caught the gate in its window
      return getattr(module or importlib.import_module(name), attr)
    if module is None or ((name, attr) not in ALLOWED and not _numpy_error(module, attr)):
      return _refuse(f'{name}.{attr}')
    return getattr(module, attr)


def _from_courier() -> bool:
  """Whether the import being made comes from Courier's deserializer (see the module
  docstring): no Python frame under the hook, or Courier's client module's frame."""
  try:
    caller = sys._getframe(2)  # 0: this function, 1: the hook, 2: who imported
  except ValueError:
    return True
  return caller.f_code.co_filename == _courier_client_file


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # pylint: disable=redefined-builtin
  if (type(fromlist) is list and not fromlist and level == 0 and locals is globals
      and _from_courier()):
    if name in _ALLOWED_MODULES:
      _real_import(name, globals, locals, fromlist, level)
    module = sys.modules.get(name)
    if isinstance(module, _Gate) or (module is not None
                                     and not isinstance(module, types.ModuleType)):
      return module
    sys.modules[name] = gate = _Gate(name, module, threading.get_ident())
    return gate
  return _real_import(name, globals, locals, fromlist, level)


def install() -> None:
  """Puts the guard in place for this process (idempotent). Call before the first
  Courier server or client of the process is used."""
  global _real_import, _courier_client_file
  with _lock:
    if _real_import is not None:
      return
    from courier.python import client as courier_client  # pylint: disable=g-import-not-at-top
    _courier_client_file = courier_client.__file__
    _real_import = builtins.__import__
    builtins.__import__ = _guarded_import
