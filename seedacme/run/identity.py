"""The run's saved config: a resume is the same run, or a clear refusal.

A rerun on a logdir that holds a checkpoint resumes it. Without a check, the same
command with another agent config (`--agent_config core=lstm` on a feed-forward run's
logdir) restored what matched, skipped the rest and went on as if it were the run
asked for. So the first checkpoint is saved with the run's config
(`<logdir>/checkpoints/run_config.json`, written by rename) and a resume compares its
own with it before restoring anything: any difference stops the run at start-up with
an error naming each field, saved and new value (`RunConfigMismatchError`, fatal: a
supervisor does not restart it). `--allow_config_change FIELD[,FIELD]`
(`ProgramConfig.allow_config_change`) lets a resume change the fields it names; the
change is recorded in the file, and the checkpoint restore still has to match every
saved object (`seedacme.learner.checkpointing`).

What is compared, and why:
- `agent` and every field of the agent's config dataclass: they define the networks
  (core, torso, sizes, observation normalization), the optimizer, the replay tables
  and the loss. The registry fits some defaults to the number of training envs, so a
  resize that changes them shows up here by field.
- `env`, `env_args` (game, level, scenario, `--env_config`) and `env_spec`
  (observation shape and dtype, actions): the data the networks were trained on. The
  env engine is left out: it steps the same envs.
- `seed`: a seed sweep's runs differ only by it.
Not compared: budgets and targets (a resume may extend them; but PPO with
`anneal_to_budget` derives its learning-rate decay steps from `--max_env_steps`, so a
resume with another budget changes `agent_config.learning_rate_decay_steps` and is
refused unless that field is allowed to change), the number of actors and
envs per actor (server-side per-env state is rebuilt at every start and not
checkpointed), evaluation, batching, devices, transport, intervals.
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Sequence, Tuple

from seedacme.run import logdir as logdir_lib
from seedacme.run.logdir import is_local  # noqa: F401  (launchers check local logdirs)

CHECKPOINTS = 'checkpoints'  # the central node's checkpoint directory in the logdir
RUN_CONFIG = 'run_config.json'
_NESTED = ('agent_config', 'env_args', 'env_spec')


class RunConfigMismatchError(RuntimeError):
  """A resume whose config differs from the one saved with the checkpoint."""

  fatal = True  # a supervisor does not restart it (see seedacme.runtime.supervisor)


def _jsonable(value: Any) -> Any:
  """`value` as JSON would give it back (tuples become lists, unknowns their repr)."""
  return json.loads(json.dumps(value, default=repr))


def run_identity(builder: Any, spec: Any, config: Any) -> Dict[str, Any]:
  """The fields that make a run this run (module docstring), JSON-ready."""
  agent_config = getattr(builder, 'config', None)
  return _jsonable({
      'agent': getattr(builder, 'name', type(builder).__name__),
      'agent_config': dataclasses.asdict(agent_config)
                      if dataclasses.is_dataclass(agent_config) else {},
      'env': config.env_name,
      'env_args': dict(config.env_args) if config.env_name is not None else None,
      'env_spec': dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else repr(spec),
      'seed': config.seed,
  })


def _flatten(identity: Dict[str, Any]) -> Dict[str, Any]:
  flat = {}
  for key, value in identity.items():
    if key in _NESTED and isinstance(value, dict):
      flat.update({f'{key}.{k}': v for k, v in value.items()})
    else:
      flat[key] = value
  return flat


def differences(saved: Dict[str, Any], current: Dict[str, Any]
                ) -> List[Tuple[str, Any, Any]]:
  """(field, saved value, current value) of every field both name and set differently.

  A field only one side has (added or removed by a code change) is not a difference;
  nor is the env's name where one side did not record it (a program composed in
  Python): its spec is still compared."""
  old, new = _flatten(saved), _flatten(current)
  if saved.get('env') is None or current.get('env') is None:
    for flat in (old, new):
      for key in [k for k in flat if k == 'env' or k.startswith('env_args')]:
        del flat[key]
  return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def _allowed(field: str, allowed: Sequence[str]) -> bool:
  return field in allowed or field.rsplit('.', 1)[-1] in allowed


def compare(saved: Dict[str, Any], current: Dict[str, Any], allowed: Sequence[str] = (),
            where: str = 'this logdir') -> List[Tuple[str, Any, Any]]:
  """The differences `allowed` lets through; raises `RunConfigMismatchError` naming
  the others."""
  diffs = differences(saved, current)
  refused = [d for d in diffs if not _allowed(d[0], allowed)]
  if refused:
    fields = '; '.join(f'{k}: saved {a!r}, now {b!r}' for k, a, b in refused)
    names = ','.join(k.rsplit('.', 1)[-1] if k.startswith('agent_config.') else k
                     for k, _, _ in refused)
    raise RunConfigMismatchError(
        f'refusing to resume {where}: its checkpoint belongs to a run with another '
        f'config ({fields}). Rerun with the saved config, use another --logdir, or, '
        f'for a change the checkpoint can take, --allow_config_change {names}')
  return diffs


def config_path(directory: str) -> str:
  return os.path.join(directory, RUN_CONFIG)


def read_saved(directory: str) -> Dict[str, Any] | None:
  """The saved run config of checkpoint directory `directory` (None: none saved)."""
  saved = logdir_lib.read_json(config_path(directory))
  return None if saved is None else saved['config']


def save(directory: str, identity: Dict[str, Any],
         change: Dict[str, Any] | None = None, fresh: bool = False) -> None:
  """Writes the run config beside the checkpoints (by rename); `change` (an allowed
  change on resume) is appended to the file's record of changes (`fresh`: a new run,
  whatever an older file recorded)."""
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
  the saved config ([] for a fresh start or a checkpoint saved without one); raises
  `RunConfigMismatchError` for the others."""
  if not has_checkpoint(directory):
    return []
  saved = read_saved(directory)
  if saved is None:
    return []
  return compare(saved, identity, allowed, where=os.path.dirname(directory) or directory)
