"""The run's saved config: a resume is the same run, or a clear refusal.

A rerun on a logdir that holds a checkpoint resumes it. Without a check, the same
command with another agent config (`--agent_config core=lstm` on a feed-forward run's
logdir) restored what matched, skipped the rest and went on as if it were the run
asked for. So the first checkpoint is saved with the run's config
(`<logdir>/checkpoints/run_config.json`, written by rename) and a resume compares its
own with it before restoring anything: any difference stops the run at start-up with
an error naming each field by its path, saved and new value (`RunConfigMismatchError`,
fatal: a supervisor does not restart it). `--allow_config_change PATH[,PATH]`
(`ProgramConfig.allow_config_change`) lets a resume change the fields it names, by
their exact paths as the refusal prints them (`agent_config.entropy_cost`,
`env_args.game`; `*`: any field); the change is recorded in the file, and the
checkpoint restore still has to match every saved object
(`seedacme.learner.checkpointing`).

What is compared, and why:
- `agent` and every field of the agent's config dataclass: they define the networks
  (core, torso, sizes, observation normalization), the optimizer, the replay tables
  and the loss. The registry fits some defaults to the number of training envs, so a
  resize that changes them shows up here by field.
- the env: `env_factory`, the training envs' factory as `make_program` was given it
  (`factory_identity`: its module and qualified name and its arguments, defaults
  filled in -- a `functools.partial`'s function and arguments, a dataclass factory's
  fields; a value that is not plain data by its type only), recorded the same way
  for a launcher's run and a program composed in Python. Where the name does not say
  what a call makes (on c8a4f53 two closures `make('Pong')`, `make('Breakout')` of
  one function had one identity, and one resumed the other's run), the factory is
  described by what it holds: a closure's captured values, a lambda's or nested
  function's constants and the names it uses, a bound method's object (its fields),
  a callable object's attributes, through partials. A value in there that is no plain
  data (an arbitrary object, a C object's hidden state) makes the identity say so
  (`'exact': False`, `inexact`: what and where), and a resume is refused unless
  `--allow_config_change env_factory.exact` says the envs are the same. `env` and
  `env_args` (the registry name, game, level, scenario, `--env_config`) where a
  launcher named them
  (a composed program has no name: None, and then only `env_factory` says which env);
  and `env_spec` (observation shape and dtype, actions). Fields that only change how
  envs are stepped, not which envs (the engine, its threads: a dataclass factory's
  fields with `metadata={'run_identity': False}`), are left out.
- `seed`: a seed sweep's runs differ only by it.
- `reproducible` and, with it, the number of training envs (`num_train_envs`: the
  rounds and seeds of `seedacme.run.schedule`), recorded only by a reproducible run:
  a resume may not switch between schedules, nor change N (another split of the same
  N envs is the same run); and its `reproducible_lag` when not 0 and
  `reproducible_threads` when not 2 (a checkpoint saved before those fields resumes as
  it was).
Not compared: budgets and targets (a resume may extend them; but PPO with
`anneal_to_budget` derives its learning-rate decay steps from `--max_env_steps`, so a
resume with another budget changes `agent_config.learning_rate_decay_steps` and is
refused unless that field is allowed to change), the number of actors and
envs per actor (server-side per-env state is rebuilt at every start and not
checkpointed), evaluation, batching, devices, transport, intervals.

Nothing passes unless both sides say it is the same. On ce34d39 three resumes went on
as another run: a composed program resumed Pong as Breakout (the env left out, the
specs equal), a checkpoint without `run_config.json` adopted whatever config came,
and a field only one side had was skipped. Now a field only one side has is a
difference (`saved <missing>`: a config saved by code older than the field), a
checkpoint without a saved config is refused unless `--allow_config_change '*'`
says to adopt this run's, and `--allow_config_change game` no longer allows
`env_args.game` (nor any other field named `game`): only the path it names.

Why ~490 lines: a run's identity must describe any env factory a user composes
(closures, lambdas, partials, bound methods, objects) exactly or say what it could not;
the describer and the comparison that names differences share those rules.
"""

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import numbers
import os
import sys
import types
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from seedacme.run import logdir as logdir_lib
from seedacme.run.logdir import is_local  # noqa: F401  (launchers check local logdirs)

CHECKPOINTS = 'checkpoints'  # the central node's checkpoint directory in the logdir
RUN_CONFIG = 'run_config.json'
ANY_FIELD = '*'  # `--allow_config_change '*'`: any difference, a missing config too


class _Missing:
  """A field the config of one side does not have."""

  def __repr__(self) -> str:
    return '<missing>'


MISSING = _Missing()


class RunConfigMismatchError(RuntimeError):
  """A resume whose config differs from the one saved with the checkpoint."""

  fatal = True  # a supervisor does not restart it (see seedacme.runtime.supervisor)


def _jsonable(value: Any) -> Any:
  """`value` as JSON would give it back (tuples become lists, unknowns their repr)."""
  return json.loads(json.dumps(value, default=repr))


def _qualified(obj: Any) -> str:
  return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# How deep `_Describer` follows values (captures of captures, fields of fields).
_MAX_DEPTH = 12
# Where a factory is described only in part (`_Describer`): this field of its identity
# says so, and naming it (`--allow_config_change env_factory.exact`) lets a resume on.
INEXACT = 'env_factory.exact'


def _named(obj: Any) -> bool:
  """Whether `obj` is what its module and qualified name lead to: a module-level
  function or class (not a lambda, nor one defined inside a function)."""
  target = sys.modules.get(getattr(obj, '__module__', None) or '')
  for part in str(getattr(obj, '__qualname__', '<?>')).split('.'):
    target = getattr(target, part, None)
  return target is obj or getattr(target, '__func__', None) is obj  # a classmethod's


def _has_slots(kind: type) -> bool:
  return any('__slots__' in vars(k) for k in kind.__mro__ if k is not object)


class _Describer:
  """Describes a factory as plain data (`factory_identity`), collecting in `loose`
  what it could describe only by type (an arbitrary object, a C object's hidden state,
  a class defined inside a function), each by where it is."""

  def __init__(self):
    self.loose: List[str] = []
    self._active: set = set()  # ids on the current path: a cycle is named, not followed

  def _inexact(self, path: str, why: str, shown: str | None = None) -> str:
    self.loose.append(f'{path or "the factory"}: {why}')
    return shown or f'<{why}>'

  def plain(self, value: Any, path: str, depth: int = 0) -> Any:
    """`value` as plain data: numbers, strings, lists, dicts, a dataclass by its fields,
    an array by its digest, a callable as a factory; anything else by its type only
    (never a repr with an address: it would differ per run), and noted in `loose`."""
    if value is None or isinstance(value, (bool, str)):
      return value
    if isinstance(value, np.generic):
      value = value.item()
    if isinstance(value, numbers.Integral):
      return int(value)
    if isinstance(value, numbers.Real):
      return float(value)
    if isinstance(value, enum.Enum):
      return f'{_qualified(type(value))}.{value.name}'
    if isinstance(value, bytes):
      return value.hex()
    if isinstance(value, types.ModuleType):
      return f'<module {value.__name__}>'
    if isinstance(value, np.ndarray) and value.dtype.kind in 'biufc':
      digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
      return {'array': value.dtype.str, 'shape': list(value.shape), 'sha256': digest}
    if depth > _MAX_DEPTH:
      return self._inexact(path, f'nested deeper than {_MAX_DEPTH}')
    if id(value) in self._active:
      return '<cycle>'
    self._active.add(id(value))
    try:
      return self._container(value, path, depth + 1)
    finally:
      self._active.discard(id(value))

  def _container(self, value: Any, path: str, depth: int) -> Any:
    if isinstance(value, (list, tuple)):
      return [self.plain(v, f'{path}[{i}]', depth) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
      items = [self.plain(v, f'{path}[]', depth) for v in value]
      return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=repr))
    if isinstance(value, dict):
      if all(isinstance(k, str) for k in value):
        return {k: self.plain(v, f'{path}.{k}', depth) for k, v in value.items()}
      return [[self.plain(k, f'{path}[]', depth), self.plain(v, f'{path}[{k!r}]', depth)]
              for k, v in value.items()]
    if callable(value):
      return self.factory(value, path, depth)
    if dataclasses.is_dataclass(value):
      return {f.name: self.plain(getattr(value, f.name), f'{path}.{f.name}', depth)
              for f in dataclasses.fields(value)}
    kind = _qualified(type(value))
    return self._inexact(path, f'a {kind} object', f'<{kind} object>')

  def arguments(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any], path: str,
                depth: int) -> Dict[str, Any]:
    """The arguments a call of `func` gets besides the seed, by name, defaults filled."""
    try:
      signature = inspect.signature(func)
      bound = signature.bind_partial(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or not one these arguments fit
      return {**{str(i): self.plain(a, f'{path}.{i}', depth) for i, a in enumerate(args)},
              **{k: self.plain(v, f'{path}.{k}', depth) for k, v in kwargs.items()}}
    bound.apply_defaults()
    named = {}
    for name, value in bound.arguments.items():
      kind = signature.parameters[name].kind
      if kind is inspect.Parameter.VAR_KEYWORD:
        named.update({k: self.plain(v, f'{path}.{k}', depth) for k, v in value.items()})
      elif kind is not inspect.Parameter.VAR_POSITIONAL or value:
        named[name] = self.plain(value, f'{path}.{name}', depth)
    return named

  def factory(self, factory: Any, path: str = '', depth: int = 0, args: Sequence[Any] = (),
              kwargs: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """{'factory': module.qualname, 'args': {...}} and, where the name alone does not
    say what a call makes, what the callable holds: a closure's `captures`, an unnamed
    function's `code` (its constants and the names it uses), a bound method's `self`
    (described as a factory), a callable object's fields as its `args`."""
    kwargs = kwargs or {}
    at = lambda key: f'{path}.{key}' if path else key
    if isinstance(factory, functools.partial):
      return self.factory(factory.func, path, depth, tuple(factory.args) + tuple(args),
                          {**factory.keywords, **kwargs})
    if inspect.ismethod(factory) or (inspect.isbuiltin(factory) and not isinstance(
        getattr(factory, '__self__', None), (types.ModuleType, type(None)))):
      owner = factory.__self__
      described = (self.factory(factory.__func__, path, depth) if inspect.ismethod(factory)
                   else {'factory': f'{_qualified(type(owner))}.{factory.__name__}'})
      described['args'] = self.arguments(factory, args, kwargs, at('args'), depth)
      described['self'] = (self.plain(owner, at('self'), depth) if inspect.isclass(owner)
                           else self._object(owner, at('self'), depth))
      return described
    if inspect.isfunction(factory) or inspect.isbuiltin(factory):
      described = {'factory': _qualified(factory),
                   'args': self.arguments(factory, args, kwargs, at('args'), depth)}
      cells = getattr(factory, '__closure__', None) or ()
      if cells:
        described['captures'] = {
            name: self._cell(cell, f'{at("captures")}.{name}', depth)
            for name, cell in zip(factory.__code__.co_freevars, cells)}
      if inspect.isfunction(factory) and not _named(factory):
        described['code'] = _code(factory.__code__, factory.__doc__)
      return described
    if inspect.isclass(factory):
      if not _named(factory):
        self._inexact(path, f'{_qualified(factory)}, a class defined inside a function')
      return {'factory': _qualified(factory),
              'args': self.arguments(factory, args, kwargs, at('args'), depth)}
    described = self._object(factory, path, depth)
    if args or kwargs:
      described['call'] = self.arguments(factory, args, kwargs, at('call'), depth)
    return described

  def _cell(self, cell: Any, path: str, depth: int) -> Any:
    try:
      contents = cell.cell_contents
    except ValueError:  # a name the function assigns after this was made
      return '<empty>'
    return self.plain(contents, path, depth + 1)

  def _object(self, obj: Any, path: str, depth: int) -> Dict[str, Any]:
    """An object by its class and its state: a dataclass's fields (but those marked
    `metadata={'run_identity': False}`), else its attributes and slots; an object
    whose state is not visible (a C object's) is noted in `loose`."""
    kind = type(obj)
    at = lambda key: f'{path}.{key}' if path else key
    if not _named(kind):
      self._inexact(path, f'a {_qualified(kind)}, a class defined inside a function')
    if dataclasses.is_dataclass(obj):
      fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                if f.metadata.get('run_identity', True)}
    elif hasattr(obj, '__dict__') or _has_slots(kind):
      fields = dict(getattr(obj, '__dict__', {}))
      for k in kind.__mro__:
        slots = vars(k).get('__slots__', ())
        for name in (slots,) if isinstance(slots, str) else slots:
          if name not in ('__dict__', '__weakref__') and hasattr(obj, name):
            fields.setdefault(name, getattr(obj, name))
    else:
      fields = {}
      self._inexact(path, f'a {_qualified(kind)} object, whose state is not visible')
    if id(obj) in self._active:
      return {'factory': _qualified(kind), 'args': '<cycle>'}
    self._active.add(id(obj))
    try:
      return {'factory': _qualified(kind),
              'args': {k: self.plain(v, f'{at("args")}.{k}', depth + 1)
                       for k, v in sorted(fields.items())}}
    finally:
      self._active.discard(id(obj))


def _code(code: types.CodeType, doc: str | None = None) -> Dict[str, List[str]]:
  """What an unnamed function's code uses: its constants (by repr: these are literals)
  and the names it reads, its nested code's included; not its docstring, and not its
  bytecode, which differs between Python versions."""
  constants, names = [], list(code.co_names)
  for i, constant in enumerate(code.co_consts):
    if isinstance(constant, types.CodeType):
      nested = _code(constant)
      constants += nested['constants']
      names += nested['names']
    elif constant is not None and not (i == 0 and doc is not None and constant == doc):
      constants.append(repr(constant))
  return {'constants': constants, 'names': names}


def factory_identity(factory: Any) -> Dict[str, Any] | None:
  """Which envs `factory(seed)` makes: {'factory': module.qualname, 'args': {...}}.

  A `functools.partial`: its function and arguments; a dataclass instance (e.g.
  `AtariFactory`): its class and fields, but for those marked
  `metadata={'run_identity': False}`; a module-level function or class: itself and its
  defaults. Where the name does not say what a call makes, what the callable holds
  too (`_Describer.factory`): a closure's captured values, a lambda's or nested
  function's constants and names, a bound method's object, a callable object's
  attributes. Where a value in there could be described only by its type, the
  identity says so: 'exact': False and 'inexact' (what, where), and a resume refuses
  it unless `--allow_config_change env_factory.exact` (`compare`)."""
  if factory is None:
    return None
  describer = _Describer()
  described = describer.factory(factory)
  if describer.loose:
    described['exact'] = False
    described['inexact'] = sorted(set(describer.loose))[:16]
  return described


def run_identity(builder: Any, spec: Any, config: Any) -> Dict[str, Any]:
  """The fields that make a run this run (module docstring), JSON-ready."""
  agent_config = getattr(builder, 'config', None)
  return _jsonable({
      'agent': getattr(builder, 'name', type(builder).__name__),
      'agent_config': dataclasses.asdict(agent_config)
                      if dataclasses.is_dataclass(agent_config) else {},
      'env': config.env_name,
      'env_args': dict(config.env_args) if config.env_name is not None else None,
      'env_factory': config.env_factory_identity,
      'env_spec': dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else repr(spec),
      'seed': config.seed,
      # Only a reproducible run records its schedule: a checkpoint saved before the
      # field (or by a run without it) still resumes, and a resume may not switch it.
      **({'reproducible': True, 'num_train_envs': config.num_train_envs}
         if getattr(config, 'reproducible', False) else {}),
      **({'reproducible_lag': config.reproducible_lag}
         if getattr(config, 'reproducible', False)
         and getattr(config, 'reproducible_lag', 0) else {}),
      **({'reproducible_threads': config.reproducible_threads}
         if getattr(config, 'reproducible', False)
         and getattr(config, 'reproducible_threads', 2) != 2 else {}),
  })


def _pairs(old: Any, new: Any, prefix: str = '') -> Iterator[Tuple[str, Any, Any]]:
  """(path, saved, current) of every field, nested dicts by their dotted path; a field
  one side lacks is MISSING there (a whole group it lacks: the group, once)."""
  for key in sorted(old.keys() | new.keys()):
    a, b = old.get(key, MISSING), new.get(key, MISSING)
    if isinstance(a, dict) and isinstance(b, dict):
      yield from _pairs(a, b, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', a, b


def _composed(identity: Dict[str, Any]) -> bool:
  return 'env' in identity and identity['env'] is None


def _comparable(saved: Dict[str, Any], current: Dict[str, Any]
                ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """Both sides without the launcher's env name and arguments when only one of them
  has them (a composed program's run against a launcher's): `env_factory`, which
  both record, says which env."""
  if _composed(saved) == _composed(current):
    return saved, current
  strip = lambda d: {k: v for k, v in d.items() if k not in ('env', 'env_args')}
  return strip(saved), strip(current)


def differences(saved: Dict[str, Any], current: Dict[str, Any]
                ) -> List[Tuple[str, Any, Any]]:
  """(field path, saved value, current value) of every field the two set differently,
  a field only one side has included (MISSING on the other)."""
  return [(k, a, b) for k, a, b in _pairs(*_comparable(saved, current)) if a != b]


def _paths(saved: Dict[str, Any], current: Dict[str, Any]) -> set:
  """Every field path either side has, groups included."""
  paths = set()
  for path, _, _ in _pairs(saved, current):
    parts = path.split('.')
    paths.update('.'.join(parts[:i]) for i in range(1, len(parts) + 1))
  return paths


def _inexact(identity: Dict[str, Any]) -> List[str]:
  """What the env factory of `identity` holds that was described by type only."""
  factory = identity.get('env_factory')
  if isinstance(factory, dict) and factory.get('exact') is False:
    return [str(r) for r in factory.get('inexact') or ['not described']]
  return []


def _allowed(field: str, allowed: Sequence[str]) -> bool:
  return field in allowed or ANY_FIELD in allowed


def compare(saved: Dict[str, Any], current: Dict[str, Any], allowed: Sequence[str] = (),
            where: str = 'this logdir') -> List[Tuple[str, Any, Any]]:
  """The differences `allowed` lets through; raises `RunConfigMismatchError` naming
  the others and the exact `--allow_config_change` that would let them through. An
  env factory described only in part (`factory_identity`), on either side, is refused
  unless `allowed` names `env_factory.exact`: equal descriptions do not make it the same."""
  diffs = differences(saved, current)
  refused = [d for d in diffs if not _allowed(d[0], allowed)]
  unsure = [] if _allowed(INEXACT, allowed) else sorted(
      {r for side in (saved, current) for r in _inexact(side)})
  if not refused and not unsure:
    return diffs
  names = [k for k, _, _ in refused]
  notes = ''
  if any(MISSING in (a, b) for _, a, b in refused):
    notes += (' (<missing>: that side\'s config has no such field -- a config saved '
              'by code older than the field, or a field since removed)')
  unknown = [a for a in allowed if a != ANY_FIELD and a not in _paths(saved, current)]
  if unknown:
    notes += (f'; --allow_config_change {",".join(unknown)} names no field: it takes '
              'fields by their full path, as listed here')
  if unsure:
    names += [] if INEXACT in names else [INEXACT]
    notes += ('; its env factory is described only in part, so nothing says the '
              f'checkpoint\'s envs are this run\'s ({"; ".join(unsure)})')
  fields = '; '.join(f'{k}: saved {a!r}, now {b!r}' for k, a, b in refused)
  what = (f'belongs to a run with another config ({fields})' if refused
          else 'may belong to another run')
  raise RunConfigMismatchError(
      f'refusing to resume {where}: its checkpoint {what}{notes}. Rerun with the saved '
      'config, use another --logdir, or, for a change the checkpoint can take (for a '
      f'factory described in part: the same envs), --allow_config_change {",".join(names)}')


def config_path(directory: str) -> str:
  return os.path.join(directory, RUN_CONFIG)


def read_saved(directory: str) -> Dict[str, Any] | None:
  """The saved run config of checkpoint directory `directory` (None: none saved)."""
  saved = logdir_lib.read_json(config_path(directory))
  return None if saved is None else saved['config']


def change_record(learner_step: int, changes: List[Tuple[str, Any, Any]]) -> Dict[str, Any]:
  """The file's record of an allowed change (a MISSING side as '<missing>')."""
  value = lambda v: repr(v) if v is MISSING else v
  return {'learner_step': learner_step,
          'fields': {k: [value(a), value(b)] for k, a, b in changes}}


def save(directory: str, identity: Dict[str, Any],
         change: Dict[str, Any] | None = None, fresh: bool = False) -> None:
  """Writes the run config beside the checkpoints (by rename); `change` (an allowed
  change on resume, `change_record`) is appended to the file's record of changes
  (`fresh`: a new run, whatever an older file recorded)."""
  path = config_path(directory)
  previous = {} if fresh else logdir_lib.read_json(path) or {}
  changes = list(previous.get('changes', [])) + ([change] if change else [])
  logdir_lib.filesystem(directory).makedirs(directory)
  logdir_lib.write_json(path, {'config': identity, 'changes': changes})


def has_checkpoint(directory: str) -> bool:
  """Whether `directory` holds a checkpoint (its `tf.train.CheckpointManager` state)."""
  return logdir_lib.exists(os.path.join(directory, 'checkpoint'))


def check_resume(directory: str, identity: Dict[str, Any],
                 allowed: Sequence[str] = ()) -> List[Tuple[str, Any, Any]]:
  """Before a start on checkpoint directory `directory`: the allowed differences from
  the saved config ([] for a fresh start); raises `RunConfigMismatchError` for the
  others, and for a checkpoint saved without a config unless `allowed` has
  `ANY_FIELD` (then every field is a difference from MISSING)."""
  if not has_checkpoint(directory):
    return []
  where = os.path.dirname(directory) or directory
  saved = read_saved(directory)
  if saved is None:
    if ANY_FIELD not in allowed:
      raise RunConfigMismatchError(
          f'refusing to resume {where}: its checkpoint has no saved run config '
          f'({config_path(directory)} is missing: saved by code older than run configs, '
          'or removed), so nothing says it is the run asked for. Use another --logdir, '
          "or resume it as this run with --allow_config_change '*' (this run's config "
          'is saved from then on)')
    return differences({}, identity)
  return compare(saved, identity, allowed, where=where)
