"""How seedacme's long-running loops learn that they should stop."""

import threading


def default_stop_event() -> threading.Event:
  """Launchpad's stop event inside a Launchpad node; a private event elsewhere."""
  try:
    import launchpad as lp  # pylint: disable=g-import-not-at-top
    return lp.stop_event()
  except RuntimeError:  # Not inside a Launchpad node (tests, supervised children).
    return threading.Event()


class ShutdownError(RuntimeError):
  """Work refused because the component doing it is stopping (an orderly shutdown)."""
