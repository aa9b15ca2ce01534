"""RequestBatcher: ordering, full batches, timeouts, per-caller errors, shutdown."""

import threading
import time

import pytest

from seedacme.serving.batcher import BatcherClosedError, RequestBatcher


def _run_callers(batcher, items, sizes=None):
  results, errors = {}, {}
  sizes = sizes or [1] * len(items)

  def call(i):
    try:
      results[i] = batcher(items[i], sizes[i])
    except Exception as e:  # noqa: BLE001
      errors[i] = e

  threads = [threading.Thread(target=call, args=(i,)) for i in range(len(items))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(10)
  return results, errors


def test_each_caller_gets_its_own_result_from_one_batch():
  calls = []

  def process(batch):
    calls.append(list(batch))
    return [x * 10 for x in batch]

  b = RequestBatcher(process, max_batch_size=8, timeout_s=1.0)
  try:
    results, errors = _run_callers(b, list(range(8)))
  finally:
    b.close()
  assert errors == {}
  assert results == {i: 10 * i for i in range(8)}
  assert len(calls) == 1 and sorted(calls[0]) == list(range(8))  # one call for all
  assert b.stats().full_batches == 1


def test_full_batch_does_not_wait_for_timeout():
  b = RequestBatcher(lambda batch: list(batch), max_batch_size=2, timeout_s=30.0)
  try:
    start = time.monotonic()
    results, _ = _run_callers(b, ['a', 'b'])
    elapsed = time.monotonic() - start
  finally:
    b.close()
  assert results == {0: 'a', 1: 'b'}
  assert elapsed < 5.0  # far below the 30 s timeout


def test_partial_batch_runs_after_timeout():
  b = RequestBatcher(lambda batch: [len(batch)] * len(batch), max_batch_size=100,
                     timeout_s=0.05)
  try:
    start = time.monotonic()
    assert b('only', 1) == 1  # processed alone, once the timeout passed
    assert time.monotonic() - start >= 0.04
  finally:
    b.close()
  stats = b.stats()
  assert stats.batches == 1 and stats.full_batches == 0 and stats.units == 1


def test_sizes_count_towards_the_batch():
  seen = []

  def process(batch):
    seen.append(len(batch))
    return list(batch)

  b = RequestBatcher(process, max_batch_size=10, timeout_s=5.0)
  try:
    start = time.monotonic()
    results, _ = _run_callers(b, ['x', 'y'], sizes=[6, 4])  # 6 + 4 fills the batch
  finally:
    b.close()
  assert results == {0: 'x', 1: 'y'} and seen == [2]
  assert time.monotonic() - start < 4.0


def test_errors_go_to_their_caller_only():
  def process(batch):
    return [ValueError(f'bad {x}') if x < 0 else x for x in batch]

  b = RequestBatcher(process, max_batch_size=4, timeout_s=1.0)
  try:
    results, errors = _run_callers(b, [1, -2, 3, -4])
    assert results == {0: 1, 2: 3}
    assert set(errors) == {1, 3} and 'bad -2' in str(errors[1])
    assert b(5) == 5  # the batcher keeps serving
  finally:
    b.close()


def test_process_fn_crash_fails_that_batch_and_keeps_serving():
  state = {'n': 0}

  def process(batch):
    state['n'] += 1
    if state['n'] == 1:
      raise RuntimeError('boom')
    return list(batch)

  b = RequestBatcher(process, max_batch_size=1, timeout_s=0.01)
  try:
    with pytest.raises(RuntimeError, match='boom'):
      b('first')
    assert b('second') == 'second'
  finally:
    b.close()


def test_close_fails_pending_and_later_requests():
  release = threading.Event()

  def process(batch):
    release.wait(5)
    return list(batch)

  b = RequestBatcher(process, max_batch_size=1, timeout_s=0.0)
  results, errors = {}, {}

  def call(name):
    try:
      results[name] = b(name)
    except Exception as e:  # noqa: BLE001
      errors[name] = e

  first = threading.Thread(target=call, args=('in flight',))
  first.start()
  time.sleep(0.1)
  queued = threading.Thread(target=call, args=('queued',))  # waits behind the first
  queued.start()
  time.sleep(0.1)
  closer = threading.Thread(target=b.close)
  closer.start()
  time.sleep(0.1)
  release.set()
  for t in (first, queued, closer):
    t.join(10)
  assert results == {'in flight': 'in flight'}
  assert isinstance(errors['queued'], BatcherClosedError)
  with pytest.raises(BatcherClosedError):
    b('late')


def test_batches_run_on_caller_threads_one_at_a_time():
  """No batching thread: a caller leads; batches never overlap; results never mix."""
  active, overlaps, runner_threads = [0], [0], set()
  lock = threading.Lock()
  callers = set()

  def process(batch):
    with lock:
      active[0] += 1
      overlaps[0] += active[0] > 1
    runner_threads.add(threading.current_thread().name)
    time.sleep(0.0005)
    with lock:
      active[0] -= 1
    return [(name, i * 2) for name, i in batch]

  threads_before = threading.active_count()
  b = RequestBatcher(process, max_batch_size=6, timeout_s=0.002)
  assert threading.active_count() == threads_before
  wrong = []

  def caller(name):
    callers.add(name)
    for i in range(150):
      if b((name, i), size=1 + i % 3) != (name, 2 * i):
        wrong.append((name, i))

  threads = [threading.Thread(target=caller, args=(f'caller{j}',), name=f'caller{j}')
             for j in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  b.close()
  assert not wrong
  assert overlaps[0] == 0
  assert runner_threads <= callers  # every batch ran on some caller's thread
  stats = b.stats()
  assert stats.items == 8 * 150
  assert stats.batches < stats.items  # requests were actually batched together
