"""`run_local <env> <agent> <num_actors> [envs_per_actor]`: a SEED program on this machine.

In the spirit of seed_rl's `run_local.sh`: builds the Launchpad program, launches every
node as a local process (`local_mp`), shows one progress line per record the central
node writes, and prints a final summary when the budget is reached. Ctrl-C stops every
node cleanly. All node logs go to `<logdir>/nodes/`, progress to
`<logdir>/progress.jsonl`, TensorBoard events to `<logdir>/tensorboard/`.
"""

import argparse
import ast
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
from typing import Any, Dict, List

import seedacme  # noqa: F401  (sets TF log levels before anything imports TF)
from seedacme import envs
from seedacme.agents import registry as agents
from seedacme.config import ProgramConfig
from seedacme.curves import write_curves
from seedacme.envs.registry import ENGINES
from seedacme.progress import format_line


def parse_args(argv: List[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='run_local', description=__doc__.split('\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('env', choices=envs.ENV_NAMES)
  parser.add_argument('agent', choices=agents.AGENT_NAMES)
  parser.add_argument('num_actors', type=int)
  parser.add_argument('envs_per_actor', type=int, nargs='?', default=16)
  parser.add_argument('--max_seconds', type=float, default=120.0,
                      help='stop after this long (0: no limit)')
  parser.add_argument('--max_learner_steps', type=int, default=0, help='0: no limit')
  parser.add_argument('--max_env_steps', type=int, default=0, help='0: no limit')
  parser.add_argument('--target_return', type=float, default=None,
                      help='stop once the average return reaches this')
  parser.add_argument('--target_on', choices=('train', 'eval'), default='train',
                      help='which return --target_return watches: training episodes '
                      '(last 100) or the greedy evaluator (last 20)')
  parser.add_argument('--num_eval_envs', type=int, default=4)
  parser.add_argument('--eval_interval_s', type=float, default=0.0,
                      help='evaluate --eval_episodes greedy episodes this often (0: always)')
  parser.add_argument('--eval_episodes', type=int, default=20)
  parser.add_argument('--inference_batch_envs', type=int, default=0,
                      help='the policy runs as soon as it is free and this many envs wait '
                      '(1: whatever is queued; 0: the default of ProgramConfig)')
  parser.add_argument('--inference_timeout_ms', type=float, default=2.0,
                      help='... or once the first waiting request is this old')
  parser.add_argument('--logdir', default=None,
                      help='default: ./runs/<env>_<agent>_<time>')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--game', default=None, help='Atari game (default Pong)')
  parser.add_argument('--env_engine', choices=ENGINES, default='python',
                      help="how actors step their envs: python (a loop over K envs), "
                      "vector_sync/vector_async (Atari only: ale-py's C++ engine, all K at "
                      "once or two halves of K/2 overlapped with inference)")
  parser.add_argument('--level', default=None,
                      help='DMLab level (a DMLab-30 name or a level script path)')
  parser.add_argument('--scenario', default=None,
                      help='Football scenario (default 11_vs_11_easy_stochastic)')
  parser.add_argument('--env_config', action='append', default=[], metavar='ARG=VALUE',
                      help="an extra argument of the env's factory, e.g. --env_config "
                      "representation=simple115v2 (repeatable; like --agent_config)")
  parser.add_argument('--progress_interval_s', type=float, default=5.0)
  parser.add_argument('--network', choices=('isolated', 'host'), default='isolated',
                      help="isolated: run every node in a private network namespace with "
                      "only loopback, so Courier and Reverb (which bind all interfaces) are "
                      "unreachable from other machines; host: the machine's network")
  parser.add_argument('--learner_step_delay_s', type=float, default=0.0,
                      help='testing: pause after each learner step (a slow learner)')
  parser.add_argument('--inference', choices=('central', 'actor'), default='central',
                      help="central: SEED, one batched policy on the learner node for all "
                      "actors; actor: Acme's pattern, every actor runs its own network copy "
                      "and pulls parameters from the learner")
  parser.add_argument('--variable_update_period', type=int, default=100,
                      help='--inference actor: fetch parameters every this many calls')
  parser.add_argument('--acting_only', action='store_true',
                      help='no learner and no trajectories: measures acting throughput')
  parser.add_argument('--agent_config', action='append', default=[], metavar='FIELD=VALUE',
                      help="override a field of the agent's config dataclass, e.g. "
                      "--agent_config torso=impala_resnet --agent_config "
                      "learning_rate=3e-4 (repeatable; values are Python literals or "
                      "strings)")
  parser.add_argument('--checkpoint_interval_s', type=float, default=60.0,
                      help='checkpoint period; a rerun with the same --logdir resumes '
                      '(0: no checkpoints)')
  return parser.parse_args(argv)


def parse_overrides(items: List[str]) -> Dict[str, Any]:
  """`['torso=impala_resnet', 'hidden_sizes=(64, 64)']` -> config overrides."""
  overrides = {}
  for item in items:
    key, sep, text = item.partition('=')
    if not sep or not key.strip():
      raise ValueError(f'expected FIELD=VALUE, got {item!r}')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # a bare string such as impala_resnet
    overrides[key.strip()] = value
  return overrides


def _tail_progress(path: str, offset: int):
  """New complete JSON lines of `path` after byte `offset`."""
  if not os.path.exists(path):
    return [], offset
  with open(path) as f:
    f.seek(offset)
    data = f.read()
  end = data.rfind('\n') + 1
  records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
  return records, offset + end


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
  from seedacme import program as program_lib  # pylint: disable=g-import-not-at-top

  env_kwargs = {k: v for k, v in (('level', args.level), ('game', args.game),
                                  ('scenario', args.scenario)) if v}
  if args.env_engine != 'python':
    env_kwargs['engine'] = args.env_engine  # the factory carries it to the actors
  try:
    env_kwargs.update(parse_overrides(args.env_config))
    factory = envs.make_factory(args.env, **env_kwargs)
  except ValueError as e:  # e.g. --env_engine vector_sync for a non-Atari env
    print(f'seedacme: {e}', file=sys.stderr)
    return 2
  try:
    probe = factory(args.seed)
  except (ImportError, TypeError, ValueError) as e:  # a module to build; bad --env_config
    print(f'seedacme: cannot create {args.env!r}: {e}', file=sys.stderr)
    return 2
  spec = envs.env_spec_of(probe)
  if hasattr(probe, 'close'):
    probe.close()
  try:
    builder = agents.make_builder(args.agent, args.env,
                                  num_train_envs=args.num_actors * args.envs_per_actor,
                                  **parse_overrides(args.agent_config))
  except (TypeError, ValueError) as e:
    print(f'seedacme: bad --agent_config: {e}', file=sys.stderr)
    return 2
  config = ProgramConfig(
      num_actors=args.num_actors, envs_per_actor=args.envs_per_actor,
      num_eval_envs=args.num_eval_envs, eval_interval_s=args.eval_interval_s,
      eval_episodes=args.eval_episodes, inference_timeout_ms=args.inference_timeout_ms,
      inference_batch_envs=args.inference_batch_envs or None,
      max_seconds=args.max_seconds or None,
      max_learner_steps=args.max_learner_steps or None,
      max_env_steps=args.max_env_steps or None, target_return=args.target_return,
      target_on=args.target_on,
      logdir=logdir, progress_interval_s=args.progress_interval_s, seed=args.seed,
      checkpoint_interval_s=args.checkpoint_interval_s or None,
      learner_step_delay_s=args.learner_step_delay_s, inference=args.inference,
      variable_update_period=args.variable_update_period, train=not args.acting_only)
  # A rerun with the same logdir resumes: progress.jsonl keeps growing (the curve spans
  # every run); only the previous summary goes.
  if os.path.exists(os.path.join(logdir, 'summary.json')):
    os.remove(os.path.join(logdir, 'summary.json'))

  print(f'seedacme: {args.agent} on {args.env}: {args.num_actors} actors x '
        f'{args.envs_per_actor} envs, evaluator {args.num_eval_envs} envs, '
        f'{args.inference} inference{" (acting only)" if args.acting_only else ""}; '
        f'logdir {logdir}', flush=True)
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
  progress_path = os.path.join(logdir, 'progress.jsonl')
  offset = os.path.getsize(progress_path) if os.path.exists(progress_path) else 0
  console = _Console(sys.stdout)
  peak_rss: Dict[str, float] = {}
  while waiter.is_alive():
    waiter.join(0.5)
    _sample_node_memory(logdir, peak_rss)
    records, offset = _tail_progress(progress_path, offset)
    for record in records:
      if 'event' in record:
        console.event(f"seedacme: {record['event']}")
      else:
        console.progress(format_line(record))
  console.event('')  # Launchpad's shutdown countdown ends without a newline.
  with open(os.path.join(logdir, 'memory.json'), 'w') as f:
    json.dump({'peak_rss_mb': peak_rss}, f, indent=1)

  summary_path = os.path.join(logdir, 'summary.json')
  if failure:
    print(f'seedacme: a node failed: {failure[0]}; node logs in {logdir}/nodes',
          file=sys.stderr)
    return 1
  if not os.path.exists(summary_path):
    print(f'seedacme: the program ended without a summary; node logs in {logdir}/nodes',
          file=sys.stderr)
    return 1
  with open(summary_path) as f:
    summary = json.load(f)
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
