"""The central node's Courier surface: what actors, the evaluator and launchers call.

Launchpad's `CourierNode` serves every public method of the object it hosts; the
central node's include `finish`, `shutdown` and `run`, so any caller could end the run.
`make_central_server` binds `PUBLIC_METHODS` of a `CentralService` instead, and
installs `seedacme.wire.courier_guard` first: a message that names code rebuilds as a
stand-in, and each method refuses arguments carrying one with an error naming it.
"""

from typing import Any

from seedacme.wire import courier_guard

# The central node's Courier surface: what actors, the evaluator and launchers call.
# Launchpad would serve every public method (`finish`, `shutdown`, `run`, ...).
PUBLIC_METHODS = ('step', 'shm_offer', 'report_acting', 'get_variables', 'ping')


class CentralService:
  """Serves `PUBLIC_METHODS` of a `CentralNode` and nothing else; every call's
  arguments are checked for objects Courier was refused to rebuild
  (`seedacme.wire.courier_guard`), so such a caller gets a named error."""

  def __init__(self, node: Any):
    self._node = node

  def step(self, request):
    courier_guard.check(request, 'step')
    return self._node.step(request)

  def shm_offer(self, *args):
    courier_guard.check(args, 'shm_offer')
    return self._node.shm_offer(*args)

  def report_acting(self, report):
    courier_guard.check(report, 'report_acting')
    return self._node.report_acting(report)

  def get_variables(self, names):
    courier_guard.check(names, 'get_variables')
    return self._node.get_variables(names)

  def ping(self, *args):
    """Answers at once: an actor whose call is long unanswered sends one, and on a
    connection this end has dropped the sending itself resets it (`RpcTransport`)."""
    courier_guard.check(args, 'ping')
    return True


def make_central_server(node: Any, port: int, **courier_kwargs):
  """The Courier server of a central node: `PUBLIC_METHODS` only, behind the guard."""
  import courier  # pylint: disable=g-import-not-at-top
  courier_guard.install()
  server = courier.Server(port=port, **courier_kwargs)
  service = CentralService(node)
  for name in PUBLIC_METHODS:
    server.Bind(name, getattr(service, name))
  return server
