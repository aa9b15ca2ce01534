"""Node kills inside a running program, and a replay node's restore from its checkpoint.

A learning test carries the replay-restore check in its own program (a program takes
11-25 s to start here): `kill_replay_after_a_checkpoint` waits until the learner steps
and the replay node has written a checkpoint since, makes sure the run is still short of
its target, SIGKILLs the replay's work process, waits for its successor to restore the
checkpoint and for the learner to step on; after the program has ended,
`check_replay_restored` asserts what the restore must show. The program runs with
`--agent_config replay_checkpoint_interval_s=3` and checkpoints (`--checkpoint_interval_s`
> 0), so that the replay's checkpoints live in `<logdir>/replay` and outlive it.
"""

import dataclasses
import os
import re
import signal

from tests.integration.launch import Run, supervised_child, wait_for


def kill_child(run: Run, node: str) -> int:
  """SIGKILLs the process doing `node`'s work (its supervisor stays); returns its pid."""
  victim = supervised_child(run, node)
  os.kill(victim, signal.SIGKILL)
  return victim


def wait_for_log(run: Run, node: str, text: str, timeout: float = 60) -> None:
  assert wait_for(lambda: text in run.node_log(node), timeout, run), \
      f'{node} did not log {text!r} within {timeout:.0f}s:\n' + run.node_log(node)[-3000:]


def wait_for_learning(run: Run, when: str) -> None:
  """Waits (up to 150 s) until a progress record shows a learner step."""
  learning = lambda: any(r['learner_steps'] > 0 for r in run.progress())  # noqa: E731
  assert wait_for(learning, 150, run), \
      f'the learner never stepped {when}\n' + run.output[-3000:]


def restarted_once(run: Run, node: str, victim: int) -> bool:
  return re.search(rf'child {victim} died \(exit code -9\)( after \d+s)?; restart #1',
                   run.node_log(node)) is not None


def replay_checkpoints(run: Run) -> list:
  """Reverb checkpoints in the replay node's directory (`<logdir>/replay`: the run
  checkpoints, so its replay is kept for a resume)."""
  root = os.path.join(run.logdir, 'replay')
  return [os.path.join(root, c) for c in os.listdir(root)] if os.path.isdir(root) else []


def _complete_checkpoints(run: Run) -> set:
  """Names of the finished checkpoints (Reverb writes `DONE` last)."""
  return {os.path.basename(c) for c in replay_checkpoints(run)
          if os.path.exists(os.path.join(c, 'DONE'))}


@dataclasses.dataclass
class ReplayKill:
  victim: int  # the replay's work process that was killed
  learner_steps_at_kill: int
  elapsed_s_at_kill: float  # the run's running time at the kill (its last record)
  learner_steps_after_restore: int  # when the restore was logged

  def describe(self, summary: dict) -> str:
    """The kill against the run's end, for the log (pytest -s) and failures."""
    return (f'replay killed at learner step {self.learner_steps_at_kill} '
            f'({self.elapsed_s_at_kill:.0f} s running), restored by step '
            f'{self.learner_steps_after_restore}; the run stopped at step '
            f"{summary['learner_steps']} ({summary.get('run_elapsed_s', float('nan')):.0f} s "
            f"running): {summary['stopped_because']}")


def kill_replay_after_a_checkpoint(run: Run, target: float, watched: str) -> ReplayKill:
  """Kills the replay node's work process once a checkpoint was taken while learning,
  before the run can reach `target` (on the progress records' `watched` average: a run
  that ended first fails here, by name); waits for the restore and for learning to go on.
  """
  wait_for_learning(run, 'before the replay kill')
  # A checkpoint begun after the learner was seen stepping (names are times), finished.
  seen = _complete_checkpoints(run) | {os.path.basename(c) for c in replay_checkpoints(run)}
  fresh = lambda: bool(_complete_checkpoints(run) - seen)  # noqa: E731
  assert wait_for(fresh, 60, run), \
      'no replay checkpoint written while learning\n' + run.node_log('replay/0')[-3000:]
  records = run.progress()
  reached = [r[watched] for r in records
             if r.get(watched) is not None and r[watched] >= target]
  assert run.proc.poll() is None and not reached, (
      f'the run reached its target ({watched} {reached}) or ended before its replay node '
      f'was killed: the fault must come first\n' + run.output[-3000:])
  at_kill, elapsed = records[-1]['learner_steps'], records[-1]['elapsed_s']
  victim = kill_child(run, 'replay/0')
  wait_for_log(run, 'replay/0', 'restored the latest checkpoint', timeout=120)
  after_restore = run.progress()[-1]['learner_steps']
  # Learning goes on from the restored replay.
  assert wait_for(lambda: run.progress()[-1]['learner_steps'] > after_restore + 2, 90, run), \
      'the learner did not step on within 90 s of the replay restore\n' + run.output[-3000:]
  return ReplayKill(victim, at_kill, elapsed, after_restore)


def check_replay_restored(run: Run, kill: ReplayKill, min_size: int) -> None:
  """After the program ended: the replay restarted once, came back from its checkpoint
  with at least `min_size` items (full, not empty), learning went on past the restore,
  no temporary Reverb directory is left and the checkpoints stay in the logdir."""
  assert restarted_once(run, 'replay/0', kill.victim), run.node_log('replay/0')[-3000:]
  line = next(x for x in run.node_log('replay/0').splitlines()
              if 'restored the latest checkpoint' in x)
  restored_size = int(line.rsplit(':', 1)[1].strip(' }'))
  assert restored_size >= min_size, line  # the replay came back full, not empty
  summary = run.json('summary.json')
  print(kill.describe(summary))
  assert summary['learner_steps'] > kill.learner_steps_after_restore, \
      kill.describe(summary)  # learning went on
  tmp = os.path.join(os.path.dirname(run.logdir), 'tmp')
  assert not any(d.startswith('seedacme_reverb_') for d in os.listdir(tmp)), os.listdir(tmp)
  assert replay_checkpoints(run), 'no replay checkpoint kept in the logdir'  # for a resume
