"""Keeps what a resumable run needs to go on in a later checkout, outside the checkout.

    .venv/bin/python bench/keep_run.py runs/pong_learning_r2d2 --checkpoint
    # -> ~/.cache/seedacme/kept_runs/pong_learning_r2d2 (or $SEEDACME_KEEP_DIR/..., --dest)
    # later, in a new checkout (or on another machine, after copying that folder there):
    mkdir -p runs && cp -r ~/.cache/seedacme/kept_runs/pong_learning_r2d2 runs/
    # then the run's own command: the learner resumes at the kept checkpoint

A run's logdir is not in git (`runs/`, `bench/results/`), and a session's machine does not
outlive it, so a run longer than a session (R2D2 on Pong: ~4-5 hours to 5M env steps
here) would start over in every new checkout. This copies the run's records (progress,
summaries, launch records, TensorBoard events: KBs) and, with `--checkpoint`, its newest
learner checkpoint only (network, target network, optimizer and counters: 40 MB for
R2D2's Nature CNN + LSTM 256), with a `checkpoint` index naming just that one, and the
run's saved config beside it (`run_config.json`: without it a resume is refused, as
nothing says the checkpoint is that run's; `seedacme.run.identity`), and a
reproducible run's round states (`checkpoints/rounds/`: its resume is exact with
them, `seedacme.run.resume`). It never
copies the replay's checkpoints (GBs: a resumed run refills its replay) nor the node
logs. The run then resumes exactly where its learner was, with an empty replay.

Where it goes: `--dest`, else `$SEEDACME_KEEP_DIR/<logdir's name>`, else
`~/.cache/seedacme/kept_runs/<logdir's name>`; never inside this checkout. Kept runs
used to live in git under bench/published/; a 40 MB checkpoint per run made the clone
the size of its run dumps, and a result once published is its JSON and picture
(bench/published/<result>.json: command, commit, config, machine and load, per-seed
curves, final figures), so a kept run is only what resumes a run still in progress.
Carry the folder to the next machine yourself (or point $SEEDACME_KEEP_DIR at storage
that outlives the session). The runs once kept in git (R2D2 Pong's with its 40 MB
checkpoints, the MuJoCo studies' seeds) are in its history, in the runs/ folder of
`git archive e3a799376422 bench/published | tar -x -C DIR`.

Continuing a multi-seed MuJoCo study (`bench/mujoco_learning.py`) in a new checkout: its
finished seeds are read back from its published JSON when the command's settings match
(nothing to copy); a seed stopped before its budget resumes from its checkpoint only once
its kept folder is copied back to the logdir the bench uses:

    .venv/bin/python bench/keep_run.py \
        bench/results/mujoco/mujoco_learning_sac/HalfCheetah-v5_sac_s1 --checkpoint \
        --dest ~/.cache/seedacme/kept_runs/mujoco_learning_sac/HalfCheetah-v5_sac_s1
    # new checkout:
    mkdir -p bench/results/mujoco && \
        cp -r ~/.cache/seedacme/kept_runs/mujoco_learning_sac bench/results/mujoco/

then run the study's command again (its JSON's `command`): only the missing seeds run.
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
    # A reproducible run's round states (seedacme.run.resume: at most three, the envs
    # included): without the newest checkpoint's, its resume would not be exact.
    rounds = os.path.join(source, 'rounds')
    if os.path.isdir(rounds):
      os.makedirs(os.path.join(target, 'rounds'))
      for name in os.listdir(rounds):
        if re.match(r'^round-\d+\.pkl$', name):
          copied += os.path.getsize(shutil.copy(os.path.join(rounds, name),
                                                os.path.join(target, 'rounds')))
  return copied


KEEP_DIR_VAR = 'SEEDACME_KEEP_DIR'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_dest(logdir: str) -> str:
  """$SEEDACME_KEEP_DIR/<name>, else ~/.cache/seedacme/kept_runs/<name>."""
  root = os.environ.get(KEEP_DIR_VAR) or os.path.join(
      os.path.expanduser('~'), '.cache', 'seedacme', 'kept_runs')
  return os.path.join(root, os.path.basename(os.path.normpath(logdir)))


def inside_checkout(path: str, repo: str = REPO) -> bool:
  """Whether `path` is in this checkout (where git would carry it, or lose it with it)."""
  path, repo = os.path.realpath(path), os.path.realpath(repo)
  return os.path.isdir(os.path.join(repo, '.git')) and (
      path == repo or path.startswith(repo + os.sep))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('logdir')
  parser.add_argument('--dest', default=None,
                      help=f'the kept folder (default ${KEEP_DIR_VAR}/<logdir name>, else '
                      '~/.cache/seedacme/kept_runs/<logdir name>); not in this checkout')
  parser.add_argument('--checkpoint', action='store_true',
                      help="also the newest learner checkpoint (to resume the run)")
  args = parser.parse_args()
  dest = os.path.expanduser(args.dest) if args.dest else default_dest(args.logdir)
  if inside_checkout(dest):
    raise SystemExit(f'keep_run: {dest} is inside this checkout: kept runs go outside it '
                     f'(--dest or ${KEEP_DIR_VAR}); a published result is its JSON')
  copied = keep(args.logdir, dest, args.checkpoint)
  print(f'keep_run: {copied / 1e6:.1f} MB from {args.logdir} in {dest}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
