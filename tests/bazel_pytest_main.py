"""Entry point of every Bazel py_test: runs pytest on one test file.

Usage (from BUILD): main = "tests/bazel_pytest_main.py", args = ["$(location test_x.py)"].
Exits with pytest's exit code (0 all passed, 1 failures, 5 no tests collected, ...).

Bazel runs the test from its runfiles tree with a minimal environment. This script:
  * points HOME at Bazel's per-test TEST_TMPDIR when it is unset or not writable, makes
    sure TMPDIR is writable, and puts the interpreter's bin/ (the venv's) first on PATH;
  * drops the checkout's tests/ dir that Python puts on sys.path (this file is a symlink);
  * writes a JUnit XML report to $XML_OUTPUT_FILE, so Bazel records per-case results;
  * maps Bazel's --test_filter ($TESTBRIDGE_TEST_ONLY) onto pytest's -k;
  * disables pytest's cache (no .pytest_cache in the runfiles tree);
 * exits with os._exit once pytest has reported (see the end of this file).
Extra pytest arguments may follow the file (`bazel test --test_arg=-x ...`).
"""

import os
import sys


def _writable_dir(path):
  return bool(path) and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _prepare_environment():
  """Makes HOME, TMPDIR and PATH usable inside `bazel test`; a no-op outside it."""
  test_tmpdir = os.environ.get('TEST_TMPDIR')
  if not _writable_dir(test_tmpdir):
    return  # Not under `bazel test`: leave the environment alone.
  if not _writable_dir(os.environ.get('HOME')):
    os.environ['HOME'] = os.path.join(test_tmpdir, 'home')
    os.makedirs(os.environ['HOME'], exist_ok=True)
  # TMPDIR stays short when it can (/tmp): TEST_TMPDIR paths run past the 107-byte
  # AF_UNIX socket limit that multiprocessing, gRPC and Reverb hit with temp sockets.
  if not _writable_dir(os.environ.get('TMPDIR')):
    if _writable_dir('/tmp'):
      os.environ['TMPDIR'] = '/tmp'
    else:
      os.environ['TMPDIR'] = os.path.join(test_tmpdir, 'tmp')
      os.makedirs(os.environ['TMPDIR'], exist_ok=True)
  for var in ('TEMP', 'TMP'):  # tempfile consults these after TMPDIR
    if os.environ.get(var) and not _writable_dir(os.environ[var]):
      os.environ[var] = os.environ['TMPDIR']
  # Like an activated venv: subprocesses that run `python` or a console script by name
  # get the venv's, not the system's (Bazel's test PATH is /bin:/usr/bin:/usr/local/bin).
  bin_dir = os.path.dirname(sys.executable)
  path = os.environ.get('PATH', '')
  if bin_dir not in path.split(os.pathsep):
    os.environ['PATH'] = os.pathsep.join([bin_dir, path]) if path else bin_dir
  # Python put this script's resolved directory (the checkout's tests/) first on
  # sys.path; drop it so tests import only from the runfiles tree.
  here = os.path.dirname(os.path.realpath(__file__))
  if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == here:
    del sys.path[0]


def _pytest_args(argv):
  if not argv:
    raise SystemExit('usage: bazel_pytest_main.py TEST_FILE [PYTEST_ARGS...]')
  test_file, extra = argv[0], argv[1:]
  if not os.path.isfile(test_file):
    raise SystemExit(f'bazel_pytest_main.py: no test file {test_file!r} '
                     f'(cwd {os.getcwd()!r})')
  args = [test_file, '-p', 'no:cacheprovider', '-ra']
  if os.environ.get('TEST_SRCDIR'):
    # Bazel's cwd is the workspace root inside runfiles: make it pytest's rootdir, as
    # in the checkout, so tests/conftest.py and root config files are found.
    args.append(f'--rootdir={os.getcwd()}')
  xml_output = os.environ.get('XML_OUTPUT_FILE')
  if xml_output:
    args.append(f'--junitxml={xml_output}')
  test_filter = os.environ.get('TESTBRIDGE_TEST_ONLY')
  if test_filter:
    args += ['-k', test_filter]
  return args + extra


def main(argv):
  _prepare_environment()
  args = _pytest_args(argv)
  import pytest  # pylint: disable=g-import-not-at-top  (after the environment is set)
  return int(pytest.main(args))


if __name__ == '__main__':
  rc = main(sys.argv[1:])
  # Leave without running C++ static destructors: a file whose tests used Courier clients
  # and servers ends, once in a few runs, in `terminate called without an active
  # exception` (abort) after pytest has reported (test_courier_guard: 1 of 6 runs here,
  # and a FAILED target in CI though all 5 cases passed) -- gRPC/Courier threads torn
  # down by the interpreter's exit, not a test's outcome. The report is written by now.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(rc)
