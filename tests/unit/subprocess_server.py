"""A server script in a subprocess for tests that kill servers (test support, not a test).

`test_replay_restart.py` and `test_reverb_outages.py` run Reverb servers this way so
they can SIGKILL them as a crash would. `kill` is safe to call again: a test's
`finally` may kill a server the test already killed and reaped, and raising there
(`ProcessLookupError`) would hide the test's first error.
"""

import os
import signal
import subprocess
import sys
from typing import Sequence


class ServerProcess:
  """`python -c code *args`, its output appended to `log_path`; its temp files (Reverb's
  default checkpoint dir, never removed) in `log_path`'s directory, not /tmp."""

  def __init__(self, code: str, args: Sequence[str], log_path: str):
    self._log = open(log_path, 'a')
    env = {**os.environ, 'TMPDIR': os.path.dirname(os.path.abspath(log_path))}
    self.proc = subprocess.Popen([sys.executable, '-c', code, *args],
                                 stdout=self._log, stderr=subprocess.STDOUT, env=env)

  def kill(self) -> None:
    """SIGKILLs and reaps the server; a no-op when it is gone already (never raises)."""
    if self.proc.poll() is None:
      try:
        self.proc.send_signal(signal.SIGKILL)
      except ProcessLookupError:  # exited just now; `wait` reaps it
        pass
    self.proc.wait()
    self._log.close()
