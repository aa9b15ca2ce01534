"""Shared memory in a real program: used by default on one host, nothing left behind.

A real `run_local` program (V-trace on Catch, supervised nodes). Its actors and its
evaluator attach to the central node's shared memory; every segment is a memfd held by
exactly the two processes of one attachment. Then, in one run: `kill -9` of the central
node's child (actors re-attach to the new generation; the old segments are freed with
the dead process and the actors' ends), `kill -9` of an actor's child (the server frees
its slot; the replacement attaches), and Ctrl-C (the run stops; no process holds a
segment, and /dev/shm holds nothing new at any point).
"""

import os
import re
import signal

import pytest

from tests.integration.launch import Run, leftover_processes, supervised_child, wait_for

SEGMENT = 'seedacme-actor-segment'


def _segments(tag):
  """pid -> number of shared-memory segments it holds open, over the run's processes
  (those whose environment carries its tag: another program on the machine, such as a
  benchmark, holds segments of its own)."""
  held = {}
  for pid in map(str, leftover_processes(tag)):
    try:
      fds = os.listdir(f'/proc/{pid}/fd')
    except OSError:
      continue
    for fd in fds:
      try:
        if SEGMENT in os.readlink(f'/proc/{pid}/fd/{fd}'):
          held[int(pid)] = held.get(int(pid), 0) + 1
      except OSError:
        pass
  return held


def _wait(predicate, timeout, run):
  return wait_for(predicate, timeout, run, interval_s=0.25)


def _child(run, node):
  """The node's live supervised child, or None between a death and its restart."""
  try:
    return supervised_child(run, node)
  except AssertionError:
    return None


def _log(run, node):
  try:
    return run.node_log(node)
  except FileNotFoundError:  # the node has not started yet
    return ''


def _generations(log: str):
  return re.findall(r'requests through shared memory \(segment of \d+ envs, generation '
                    r'(\d+)\)', log)


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_shared_memory_is_the_default_and_survives_kills_without_leftovers(tmp_path):
  dev_shm = set(os.listdir('/dev/shm'))
  nodes = ('actor/0', 'actor/1', 'evaluator/0')
  with Run(['catch', 'vtrace', '2', '4', '--max_seconds', '300', '--progress_interval_s',
            '1', '--num_eval_envs', '2'], str(tmp_path)) as run:
    attached = lambda n: all(len(_generations(_log(run, x))) >= n for x in nodes)  # noqa: E731
    assert _wait(lambda: attached(1), 150, run), run.output[-3000:]
    central = supervised_child(run, 'learner/0')
    actor = supervised_child(run, 'actor/0')
    held = _segments(run.tag)
    # Three attachments: each segment open in its actor and in the central child.
    assert held.get(central) == 3 and held.get(actor) == 1, held
    assert sum(held.values()) == 6, held
    assert set(os.listdir('/dev/shm')) == dev_shm

    os.kill(central, signal.SIGKILL)  # actors re-attach to the restarted central node
    assert _wait(lambda: attached(2), 150, run), run.output[-3000:]
    new_central = _child(run, 'learner/0')
    assert new_central != central
    for node in nodes:
      generations = _generations(run.node_log(node))
      assert len(set(generations[-2:])) == 2, (node, generations)  # a new generation
    assert _wait(lambda: sum(_segments(run.tag).values()) == 6, 30, run), _segments(run.tag)
    assert _segments(run.tag).get(new_central) == 3

    os.kill(actor, signal.SIGKILL)  # the server frees its slot; the replacement attaches
    assert _wait(lambda: _child(run, 'actor/0') not in (None, actor), 60, run)
    assert _wait(lambda: len(_generations(run.node_log('actor/0'))) >= 3, 120, run), \
        run.node_log('actor/0')[-3000:]
    assert _wait(lambda: sum(_segments(run.tag).values()) == 6, 30, run), _segments(run.tag)
    assert 'detached' in run.node_log('learner/0')
    assert set(os.listdir('/dev/shm')) == dev_shm

    run.interrupt()  # Ctrl-C
    run.wait(60)
  leftovers = run.wait_for_no_leftovers()
  assert not leftovers, leftovers  # memfd segments live only as long as a process holds one
  assert set(os.listdir('/dev/shm')) == dev_shm
  assert run.json('summary.json')['stop']['kind'] == 'stop_requested'
