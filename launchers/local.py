"""`run_local <env> <agent> <num_actors> [envs_per_actor]`: a SEED program on this machine.

In the spirit of seed_rl's `run_local.sh`: builds the Launchpad program, launches every
node as a local process (`local_mp`), shows one progress line per record the central
node writes, and prints a final summary when the budget is reached. Ctrl-C stops every
node cleanly. All node logs go to `<logdir>/nodes/`, progress to
`<logdir>/progress.jsonl`, TensorBoard events to `<logdir>/tensorboard/`.
Its start-up mark (`seedacme.runtime.startup`, `launcher launching`: the program built, its
nodes about to start) goes to stdout, where `bench/startup.py` reads it.
"""

import argparse
import builtins
import datetime
import os
import re
import signal
import socket
import sys
import threading
from typing import Dict, List, Tuple

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme.run import logdir as logdir_lib
from seedacme.runtime import isolation, startup
from seedacme.envs.registry import factory_options
from seedacme.run.curves import curve_title, write_curves
from seedacme.launchers.program_flags import (ProgramArgsError, add_program_args, env_options,
                                              make_program_inputs, task_of)
from seedacme.run.progress import format_line


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='run_local', description=__doc__.split('\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_program_args(parser, logdir_help='default: ./runs/<env>_<agent>_<time>')
  parser.add_argument('--network', choices=NETWORKS, default='isolated',
                      help="isolated: run every node in a private network namespace with "
                      "only loopback, so Courier and Reverb (which bind all interfaces) are "
                      "unreachable from other machines and users; where no namespace can be "
                      "made, keep their servers on loopback and refuse other uids' "
                      "connections (the first lines say which); refuse to start where "
                      "neither holds; loopback: that fallback even where a namespace could "
                      "be made; host: the machine's network, exposed (" + EXPOSURE + ")")
  return parser.parse_args(argv)


class _Console:
  """One progress line, redrawn in place on a terminal; plain lines otherwise."""

  def __init__(self, stream):
    self._stream = stream
    self._tty = stream.isatty()
    self._open = False

  def progress(self, line: str) -> None:
    if self._tty:
      self._stream.write('\r\x1b[2K' + line)
      self._open = True
    else:
      self._stream.write(line + '\n')
    self._stream.flush()

  def event(self, line: str) -> None:
    if self._open:
      self._stream.write('\n')
      self._open = False
    if line:
      self._stream.write(line + '\n')
    self._stream.flush()


def _sample_node_memory(logdir: str, peak: Dict[str, float]) -> None:
  """Updates `peak[node] = max RSS in MB` for this launcher's node processes.

  A node is recognised by its stdout, which Launchpad points at `<logdir>/nodes/<group>/<i>`.
  """
  import psutil  # pylint: disable=g-import-not-at-top
  nodes_dir = os.path.join(logdir, 'nodes') + os.sep
  for child in psutil.Process().children(recursive=True):
    try:
      out = os.readlink(f'/proc/{child.pid}/fd/1')
      if out.startswith(nodes_dir):
        node = out[len(nodes_dir):]
        peak[node] = max(peak.get(node, 0.0), child.memory_info().rss / 2**20)
    except (OSError, psutil.Error):
      continue


_NETNS_ENV = 'SEEDACME_PRIVATE_NETNS'
NETWORKS = ('isolated', 'loopback', 'host')

# What an exposed program allows, said wherever a user chooses exposure.
EXPOSURE = ('Courier and Reverb listen on every interface of this machine and have no '
            'authentication: anyone who can reach their ports can send inference '
            'requests and reports, and read, write or reset the replay')


class ExposureError(RuntimeError):
  """The program cannot be isolated and the user did not ask to run exposed."""


def network_interfaces() -> List[str]:
  """The network interfaces this process's namespace has besides loopback, as the
  kernel lists them for it (`if_nameindex`; /sys/class/net shows the namespace sysfs
  was mounted in: inside `unshare -rn` it still listed eth0 here)."""
  return sorted(name for _, name in socket.if_nameindex() if name != 'lo')


def isolation_problem(command: List[str]) -> str | None:
  """Re-executes `command` in a private user+network namespace with only loopback up
  (`unshare -rn`), unless this process already runs in one (then returns None).

  Whether it does is read from the namespace itself (no interface but `lo`), not from
  the marker variable alone: with `SEEDACME_PRIVATE_NETNS` set by hand or inherited,
  the launcher ran on the host network, exposed, and said nothing (issue 47). A set
  marker with interfaces in sight re-executes (with a warning naming them); after our
  own re-execution (the marker holds this pid) it is refused, naming them.

  Courier and Reverb in this stack listen on every interface (`[::]:port`) with no
  option to bind loopback only. A local program needs nothing but loopback, so the
  launcher moves itself -- and with it every node it starts -- into a new namespace.
  Returns why it cannot (user namespaces unavailable, `unshare`/`ip` missing); it does
  not return when it could.
  """
  marker = os.environ.get(_NETNS_ENV)
  if marker:
    exposed = network_interfaces()
    if not exposed:
      return None  # already inside
    if marker == str(os.getpid()):  # re-executed by us (the pid stays), still exposed
      return (f'the private network namespace still has interfaces '
              f'{", ".join(exposed)}')
    print(f'seedacme: {_NETNS_ENV} is set, but this process sees network interfaces '
          f'{", ".join(exposed)}: re-executing in a private network namespace',
          file=sys.stderr)
  problem = isolation.namespace_problem()
  if problem:
    return problem
  os.environ[_NETNS_ENV] = str(os.getpid())  # `unshare` and `sh` exec: the pid stays
  sys.stdout.flush()
  sys.stderr.flush()
  os.execvp('unshare', ['unshare', '-rn', '--', 'sh', '-c',
                        'ip link set lo up && exec "$0" "$@"', *command])
  return None  # not reached


def isolate(command: List[str] | None, network: str = 'isolated') -> Tuple[str, str]:
  """Isolates the program's network the strongest way this host offers (issue 64):
  `network='isolated'` re-executes `command` in a private namespace where one can be
  made (`isolation_problem`; does not return then), else keeps every node's servers on
  loopback (`seedacme.runtime.isolation`: LD_PRELOAD set here, inherited by every node,
  connections of other uids refused at accept); `'loopback'` skips the namespace.
  Returns (mechanism, what it means), the mechanism 'namespace' once inside one.
  Raises `ExposureError` naming every mechanism's problem when none holds."""
  problems = []
  if network == 'isolated':
    if command is None:
      problems.append('namespace: this Python session cannot be re-executed in one (run '
                      'it as a script)')
    else:
      problem = isolation_problem(command)
      if problem is None:
        return 'namespace', ('a private network namespace with only loopback: no other '
                             'machine or user can reach the servers')
      problems.append(f'namespace: {problem}')
  problem = isolation.loopback_problem()
  if problem is None:
    os.environ.update(isolation.loopback_env())
    os.environ.pop(_NETNS_ENV, None)
    chosen = isolation.choose_isolation(('loopback',))  # its reason, for the notice
    return 'loopback', '; '.join(problems + [chosen.reason])
  problems.append(f'loopback: {problem}')
  raise ExposureError(_refusal('; '.join(problems), ''))


def _refusal(problem: str, how_to_allow: str) -> str:
  how_to_allow = how_to_allow or '--network host (network="host" from Python)'
  return (f'cannot isolate the network ({problem}), so the program would run exposed: '
          f'{EXPOSURE}. Refusing to start; {how_to_allow} to run on the host network '
          'anyway (behind a firewall, or on a private network or VPN)')


# Launchpad's worker manager counts its shutdown down in this process's stdout: 'Waiting
# for workers to stop for 10s.' (coloured, ending in '\r'), once a second until the nodes
# are gone. On a terminal it redraws one line; in a log or a pipe it is ten lines of
# noise after the summary. Its other messages (a node that did not stop in time, a
# crash) stay.
_COUNTDOWN = re.compile(r'(\x1b\[[0-9;]*m)*Waiting for workers to stop for \d+s\.')


def quiet_stop_countdown() -> None:
  """Keeps Launchpad's shutdown countdown out of this process's output.

  The countdown is a `print` in `launchpad.launch.worker_manager`; that module's global
  name `print` is pointed at a filter that drops the countdown and passes everything
  else on (the installed package is not edited). Idempotent.
  """
  from launchpad.launch import worker_manager  # pylint: disable=g-import-not-at-top
  passes = worker_manager.__dict__.get('print', builtins.print)
  if getattr(passes, 'drops_countdown', False):
    return

  def print_without_countdown(*args, **kwargs):
    if args and isinstance(args[0], str) and _COUNTDOWN.match(args[0]):
      return
    passes(*args, **kwargs)

  print_without_countdown.drops_countdown = True
  worker_manager.print = print_without_countdown


def run_title(args: argparse.Namespace) -> str:
  """The learning curve's title: agent, env and the level or game the training envs
  ran (the env's default when no flag named one: `--game` unset is Pong)."""
  return curve_title(args.agent, args.env,
                     task_of(factory_options(args.env, **env_options(args)[0])))


def _own_command() -> List[str] | None:
  """This process's command line, to start it again; None for an interactive session
  or a script read from stdin."""
  if not sys.argv or sys.argv[0] in ('', '-'):
    return None
  return [sys.executable, *sys.orig_argv[1:]]


def launch(program, logdir: str, network: str = 'isolated'):
  """Launches `program` on this machine the way `run_local` does; returns Launchpad's
  worker manager (`.wait()` until the program stops).

  * `network='isolated'` (default): every node runs in a private network namespace
    with only loopback. This process re-executes its own command line
    (`sys.orig_argv`) inside one first, so call it from a script or `python -m`;
    the script runs again from its start in the namespace. Where no namespace can be
    made (Ubuntu 24.04's default, containers, many HPC nodes) every node's servers are
    kept on loopback instead, other uids refused (`isolate`; 'loopback' asks for that
    directly); where neither holds it raises `ExposureError` naming why;
    `network='host'` runs exposed anyway.
  * node logs go to `<logdir>/nodes/<group>/<i>`; actors and the evaluator get
    `run_local`'s thread limits (`seedacme.nodes.program.local_resources`);
    Launchpad's shutdown countdown stays out of this process's output
    (`quiet_stop_countdown`).
  """
  if network not in NETWORKS:
    raise ValueError(f'network must be one of {NETWORKS}, got {network!r}')
  if network != 'host':
    mechanism, detail = isolate(_own_command(), network)
    print(f'seedacme: isolation: {mechanism} ({detail})', file=sys.stderr, flush=True)
  import launchpad as lp  # pylint: disable=g-import-not-at-top
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top
  from launchpad.launch.run_locally import launch_local_output_to_files as to_files  # pylint: disable=g-import-not-at-top
  nodes = os.path.join(logdir, 'nodes')
  # Made this user's, or refused (UnsafePathError) if another user made either first.
  for path in (logdir, nodes):
    logdir_lib.LocalFileSystem().makedirs(path)
  os.environ['LAUNCHPAD_LOGGING_DIR'] = nodes
  # Launchpad reads that variable once, when it is first imported (a user's script
  # has imported it by now): point the module at the run's logdir as well.
  to_files._LOGGING_DIR = nodes  # pylint: disable=protected-access
  os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
  quiet_stop_countdown()
  return lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING,
                   terminal='output_to_files',
                   local_resources=program_lib.local_resources(program))


def main(argv: List[str] | None = None) -> int:
  args = parse_args(argv)
  mechanism = None
  if args.network != 'host':
    # Called from the command line: this module again; from Python (`main(argv)`,
    # e.g. after registering an agent): the calling command line, as `launch` does.
    command = ([sys.executable, '-m', 'seedacme.launchers.local', *sys.argv[1:]]
               if argv is None else _own_command())
    try:
      mechanism, detail = isolate(command, args.network)
    except ExposureError as e:
      print(f'seedacme: {e}', file=sys.stderr)
      return 2
    print(f'seedacme: isolation: {mechanism} ({detail})', flush=True)
  else:
    print(f'seedacme: --network host: {EXPOSURE}', file=sys.stderr)
  logdir = os.path.abspath(args.logdir or os.path.join(
      'runs', f'{args.env}_{args.agent}_{datetime.datetime.now():%Y%m%d_%H%M%S}'))
  problem = logdir_lib.local_logdir_problem(logdir)  # another user's: refused here
  if problem:
    print(f'seedacme: {problem}', file=sys.stderr)
    return 2
  os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')  # before anything imports TF

  import launchpad as lp  # pylint: disable=g-import-not-at-top
  from seedacme.nodes import program as program_lib  # pylint: disable=g-import-not-at-top

  try:
    factory, spec, builder, config = make_program_inputs(args, logdir)
  except ProgramArgsError as e:
    print(f'seedacme: {e}', file=sys.stderr)
    return 2
  # A rerun with the same logdir resumes: progress.jsonl keeps growing (the curve spans
  # every run); only the previous summary goes.
  if os.path.exists(os.path.join(logdir, logdir_lib.SUMMARY)):
    os.remove(os.path.join(logdir, logdir_lib.SUMMARY))

  print(f'seedacme: {args.agent} on {args.env}: {args.num_actors} actors x '
        f'{args.envs_per_actor} envs, evaluator {args.num_eval_envs} envs, '
        f'{args.inference} inference{" (acting only)" if args.acting_only else ""}; '
        f'{config.describe_budgets()}; logdir {logdir}', flush=True)
  program = program_lib.make_program(
      builder, factory, spec, config,
      stop_program=lp.make_program_stopper(lp.LaunchType.LOCAL_MULTI_PROCESSING),
      name=f'seedacme_{args.env}_{args.agent}')
  # Printed, not logged: absl's INFO is off in this process (no flags parsed).
  print(startup.line('launcher', 'launching'), flush=True)
  manager = launch(program, logdir, network='host')  # isolated above, if asked
  checked = mechanism != 'loopback'  # the loopback mechanism's check: what listens

  failure: List[BaseException] = []

  def wait():
    try:
      manager.wait()
    except BaseException as e:  # pylint: disable=broad-except
      failure.append(e)

  waiter = threading.Thread(target=wait, daemon=True)
  waiter.start()
  progress_path = os.path.join(logdir, logdir_lib.PROGRESS)
  offset = os.path.getsize(progress_path) if os.path.exists(progress_path) else 0
  console = _Console(sys.stdout)
  peak_rss: Dict[str, float] = {}
  while waiter.is_alive():
    waiter.join(0.5)
    _sample_node_memory(logdir, peak_rss)
    records, offset = logdir_lib.tail_lines(logdir, offset)
    if not checked and records:  # the central node is up: its servers listen
      checked = True
      exposed = isolation.exposed_listeners([os.getpid()])
      if exposed:
        console.event(f'seedacme: listening beyond loopback despite the interposer: '
                      f'{", ".join(exposed)}; stopping the program')
        failure.append(ExposureError(f'servers beyond loopback: {", ".join(exposed)}'))
        os.kill(os.getpid(), signal.SIGTERM)  # Launchpad's worker manager stops the nodes
    for record in records:
      if 'event' in record:
        console.event(f"seedacme: {record['event']}")
      else:
        console.progress(format_line(record))
  console.event('')  # ends the progress line redrawn in place (a terminal's)
  logdir_lib.write_json(os.path.join(logdir, 'memory.json'), {'peak_rss_mb': peak_rss})

  if failure:
    print(f'seedacme: a node failed: {failure[0]}; node logs in {logdir}/nodes',
          file=sys.stderr)
    return 1
  summary = logdir_lib.read_summary(logdir)
  if summary is None:
    print(f'seedacme: the program ended without a summary; node logs in {logdir}/nodes',
          file=sys.stderr)
    return 1
  print(f"seedacme: done ({summary['stopped_because']}) after "
        f"{summary['elapsed_s']:.0f}s: {summary['env_steps']:,} env steps, "
        f"{summary['episodes']} episodes, {summary['learner_steps']} learner steps")
  if peak_rss:
    print('seedacme: peak RSS per node (MB): ' + ', '.join(
        f'{node} {mb:.0f}' for node, mb in sorted(peak_rss.items())))
  try:
    curves = write_curves(logdir, title=run_title(args))
    print(f"seedacme: learning curve {curves['png']} and {curves['csv']}")
  except Exception as e:  # pylint: disable=broad-except
    print(f'seedacme: could not write the learning curve: {e}', file=sys.stderr)
  ret = summary.get('average_return')
  eval_ret = summary.get('eval_average_return')
  print(f'seedacme: final average return {ret if ret is None else round(ret, 3)} '
        f'(training, last 100 episodes); greedy evaluator '
        f'{eval_ret if eval_ret is None else round(eval_ret, 3)}', flush=True)
  return 0


def run() -> None:
  """Console-script entry point."""
  sys.exit(main())


if __name__ == '__main__':
  run()
