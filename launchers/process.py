"""`run_local` started as a child process: how benchmarks and tests launch a program.

One command line (`command`) and one way to start it (`start`): in its own session, so
that a test or benchmark can signal the launcher and every node it started as a group
(`os.killpg`), with its output in a file, an environment of the caller's choosing
(tests give each run its own HOME, TMPDIR and a tag that finds leftover processes) and
the repository as working directory. The logdir is then read with `seedacme.run.logdir`.
"""

import os
import subprocess
import sys
from typing import IO, Dict, List, Sequence

MODULE = 'seedacme.launchers.local'


def command(args: Sequence[str], logdir: str | None = None,
            register: str | None = None) -> List[str]:
  """The command line of `run_local <args> [--logdir logdir]` on this Python.

  `register`: a module imported first, which registers agents or envs of its own
  (`agents.registry.register_agent`, `envs.registry.register_env`); run_local then runs
  in a private network namespace too (it re-executes its command line, as `run_local` does).
  """
  if register is None:
    cmd = [sys.executable, '-m', MODULE, *args]
  else:
    cmd = [sys.executable, '-c', f'import sys, {register}; from {MODULE} import main; '
           'sys.exit(main(sys.argv[1:]))', *args]
  if logdir is not None:
    cmd += ['--logdir', logdir]
  return cmd


def start(args: Sequence[str], logdir: str | None, stdout: IO,
          env: Dict[str, str] | None = None, cwd: str | None = None,
          new_session: bool = True, register: str | None = None,
          prefix: Sequence[str] = ()) -> subprocess.Popen:
  """Starts `run_local <args> --logdir logdir`; stdout and stderr go to `stdout`.

  `env`: variables added to this process's environment; `register`: see `command`;
  `prefix`: a command that runs it (e.g. `scripts/without_namespaces`).
  """
  return subprocess.Popen([*prefix, *command(args, logdir, register)], stdout=stdout,
                          stderr=subprocess.STDOUT,
                          env=dict(os.environ, **(env or {})), cwd=cwd,
                          start_new_session=new_session)


def run(args: Sequence[str], logdir: str | None, timeout_s: float,
        cwd: str | None = None) -> subprocess.CompletedProcess:
  """Runs `run_local <args>` to its end; its output captured as text."""
  return subprocess.run(command(args, logdir), capture_output=True, text=True,
                        timeout=timeout_s, cwd=cwd)
