"""Keeps what a resumable run needs to go on in a later checkout, in a folder under git.

    .venv/bin/python bench/keep_run.py runs/pong_learning_r2d2 \
        bench/published/runs/pong_learning_r2d2 --checkpoint
    # later, in a new checkout:
    cp -r bench/published/runs/pong_learning_r2d2 runs/   # then the run's own command

A run's logdir is not in git (`runs/`, `bench/results/`), and a session's machine does not
outlive it, so a run longer than a session (R2D2 on Pong: ~4-5 hours to 5M env steps
here) would start over in every new checkout. This copies the run's records (progress,
summaries, launch records, TensorBoard events: KBs) and, with `--checkpoint`, its newest
learner checkpoint only (network, target network, optimizer and counters: 40 MB for
R2D2's Nature CNN + LSTM 256), with a `checkpoint` index naming just that one, and the
run's saved config beside it (`run_config.json`: without it a resume is refused, as
nothing says the checkpoint is that run's; `seedacme.run.identity`). It never
copies the replay's checkpoints (GBs: a resumed run refills its replay) nor the node
logs. The run then resumes exactly where its learner was, with an empty replay.
"""

import argparse
import os
import re
import shutil
import sys

_RECORDS = re.compile(r'.*\.(json|jsonl|csv|png|txt)$')


def newest_checkpoint(directory: str) -> str | None:
  """The prefix (e.g. 'ckpt-12') the `checkpoint` index names as the newest, if any."""
  index = os.path.join(directory, 'checkpoint')
  if not os.path.isfile(index):
    return None
  with open(index) as f:
    match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', f.read(), re.M)
  return os.path.basename(match.group(1)) if match else None


def keep(logdir: str, dest: str, checkpoint: bool) -> int:
  """Copies the run's records (and its newest checkpoint) into `dest`; bytes copied."""
  if not os.path.isfile(os.path.join(logdir, 'progress.jsonl')):
    raise SystemExit(f'keep_run: {logdir} has no progress.jsonl: not a run\'s logdir')
  if os.path.exists(dest):
    shutil.rmtree(dest)  # the previous keep of this run: superseded
  os.makedirs(dest)
  copied = 0
  for name in sorted(os.listdir(logdir)):
    path = os.path.join(logdir, name)
    if os.path.isfile(path) and _RECORDS.match(name):
      copied += os.path.getsize(shutil.copy(path, dest))
  tensorboard = os.path.join(logdir, 'tensorboard')
  if os.path.isdir(tensorboard):
    shutil.copytree(tensorboard, os.path.join(dest, 'tensorboard'))
    copied += sum(os.path.getsize(os.path.join(d, f))
                  for d, _, files in os.walk(tensorboard) for f in files)
  if checkpoint:
    source = os.path.join(logdir, 'checkpoints')
    prefix = newest_checkpoint(source)
    if prefix is None:
      raise SystemExit(f'keep_run: {source} holds no checkpoint')
    target = os.path.join(dest, 'checkpoints')
    os.makedirs(target)
    for name in os.listdir(source):
      if name.startswith(prefix + '.') or name == 'run_config.json':
        copied += os.path.getsize(shutil.copy(os.path.join(source, name), target))
    with open(os.path.join(target, 'checkpoint'), 'w') as f:
      f.write(f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')
  return copied


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('logdir')
  parser.add_argument('dest')
  parser.add_argument('--checkpoint', action='store_true',
                      help="also the newest learner checkpoint (to resume the run)")
  args = parser.parse_args()
  copied = keep(args.logdir, args.dest, args.checkpoint)
  print(f'keep_run: {copied / 1e6:.1f} MB from {args.logdir} in {args.dest}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
