"""Modules imported on their first use, for the agents' builders.

A launcher builds the program from an agent's builder (its config, spec checks, which
replay, which nodes) and never runs its networks, but each builder module imported
TensorFlow, Sonnet and Reverb at the top, so every launch imported them before the first
node started: 8.8 s of the launcher's ~9.5 s to `launching` for Catch V-trace here
(quiet machine; twice that at load 3, `bench/startup.py`), and ~400 MB of RSS the
launcher kept. With `tf = lazy.load('tensorflow')` a builder reads as before; the import
happens in the process that first touches `tf.<name>` (the central node's child, which
imports TensorFlow anyway). Annotations must not touch the module at definition time:
builders use `from __future__ import annotations`.
"""

import importlib
import types


class LazyModule:
  """Stands for the module `name` and imports it at the first attribute read."""

  def __init__(self, name: str):
    self._name = name
    self._module: types.ModuleType | None = None

  def __getattr__(self, attr: str):
    if attr.startswith('__'):  # copy/pickle probes: not a reason to import
      raise AttributeError(attr)
    if self._module is None:
      self._module = importlib.import_module(self._name)
    return getattr(self._module, attr)

  def __repr__(self) -> str:
    state = 'imported' if self._module is not None else 'not imported yet'
    return f'<lazy module {self._name!r}, {state}>'


def load(name: str) -> LazyModule:
  """`name`, imported when first used (`tf = load('tensorflow')`)."""
  return LazyModule(name)
