"""`run_local <env> <agent> <num_actors> [envs_per_actor]`: a SEED program on this machine.

In the spirit of seed_rl's `run_local.sh`: builds the Launchpad program, launches every
node as a local process (`local_mp`), shows one progress line per record the central
node writes, and prints a final summary when the budget is reached. Ctrl-C stops every
node cleanly. All node logs go to `<logdir>/nodes/`, progress to
`<logdir>/progress.jsonl`, TensorBoard events to `<logdir>/tensorboard/`.
"""

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import threading
from typing import Dict, List

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme.run import logdir as logdir_lib
from seedacme.run.curves import write_curves
from seedacme.launchers.program_flags import ProgramArgsError, add_program_args, make_program_inputs
from seedacme.run.progress import format_line


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='run_local', description=__doc__.split('\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_program_args(parser, logdir_help='default: ./runs/<env>_<agent>_<time>')
  parser.add_argument('--network', choices=('isolated', 'host'), default='isolated',
                      help="isolated: run every node in a private network namespace with "
                      "only loopback, so Courier and Reverb (which bind all interfaces) are "
                      "unreachable from other machines; host: the machine's network")
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


def _isolate_network() -> bool:
  """Re-executes this launcher in a private network namespace with only loopback.

  Courier and Reverb in this stack listen on every interface (`[::]:port`) with no
  option to bind loopback only. A local program needs nothing but loopback, so the
  launcher moves itself -- and with it every node it starts -- into a new user+network
  namespace (`unshare -rn`) and brings `lo` up there. Returns False (and the caller
  stays on the host network) where user namespaces are not available.
  """
  if os.environ.get(_NETNS_ENV):
    return True  # already inside
  probe = subprocess.run(['unshare', '-rn', 'ip', 'link', 'set', 'lo', 'up'],
                         capture_output=True, text=True) if shutil.which('unshare') \
      and shutil.which('ip') else None
  if probe is None or probe.returncode != 0:
    reason = 'unshare/ip missing' if probe is None else probe.stderr.strip()
    print(f'seedacme: cannot isolate the network ({reason}); Courier and Reverb will '
          'listen on all interfaces', file=sys.stderr)
    return False
  os.environ[_NETNS_ENV] = '1'
  sys.stdout.flush()
  os.execvp('unshare', ['unshare', '-rn', '--', 'sh', '-c',
                        'ip link set lo up && exec "$0" "$@"', sys.executable, '-m',
                        'seedacme.launchers.local', *sys.argv[1:]])
  return True  # not reached


def main(argv: List[str] | None = None) -> int:
  args = parse_args(argv)
  if args.network == 'isolated' and argv is None:
    _isolate_network()
  logdir = os.path.abspath(args.logdir or os.path.join(
      'runs', f'{args.env}_{args.agent}_{datetime.datetime.now():%Y%m%d_%H%M%S}'))
  os.makedirs(os.path.join(logdir, 'nodes'), exist_ok=True)
  os.environ['LAUNCHPAD_LOGGING_DIR'] = os.path.join(logdir, 'nodes')
  os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')

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
  manager = lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING,
                      terminal='output_to_files',
                      local_resources=program_lib.local_resources(program))

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
    for record in records:
      if 'event' in record:
        console.event(f"seedacme: {record['event']}")
      else:
        console.progress(format_line(record))
  console.event('')  # Launchpad's shutdown countdown ends without a newline.
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
    curves = write_curves(logdir, title=f'{args.agent} on {args.env}')
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
