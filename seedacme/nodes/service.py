"""The central node's Courier surface: what actors, the evaluator and launchers call.

Launchpad's `CourierNode` serves every public method of the object it hosts; the
central node's include `finish`, `shutdown` and `run`, so any caller could end the run.
`make_central_server` binds `PUBLIC_METHODS` of a `CentralService` instead, and
installs `seedacme.wire.courier_guard` first: a message that names code rebuilds as a
stand-in, and each method refuses arguments carrying one with an error naming it. What
the arguments say is checked where they are used, each wrong field refused by name
(`InvalidRequestError`): `step` by `seedacme.wire.protocol.validate_request`,
`report_acting` by `seedacme.wire.reports.check_report` (in `ReportIntake`),
`get_variables` by `check_variable_names`, `shm_offer`'s pid by `ShmServer.offer`,
`env_snapshot` and `resume_envs` by `CentralNode` (`seedacme.run.resume`).
"""

from typing import Any

from seedacme.wire import courier_guard

# The central node's Courier surface: what actors, the evaluator and launchers call.
# Launchpad would serve every public method (`finish`, `shutdown`, `run`, ...).
PUBLIC_METHODS = ('step', 'shm_offer', 'report_acting', 'get_variables', 'ping',
                  'env_snapshot', 'resume_envs')


class CentralService:
  """Serves `PUBLIC_METHODS` of a `CentralNode` and nothing else, on seedacme's wire
  (`seedacme.wire.courier_guard`): every call's arguments are checked for anything
  refused (a caller gets a named error) and decoded (`accept`), every result sent as
  plain values (`plain`: no pickled numpy for the caller to rebuild)."""

  def __init__(self, node: Any):
    self._node = node

  def step(self, request):
    request = courier_guard.accept(request, 'step')
    return courier_guard.plain(self._node.step(request))

  def shm_offer(self, *args):
    if len(args) > 1:  # (pid) or (); the pid itself is checked by `ShmServer.offer`
      from seedacme.wire.protocol import InvalidRequestError  # pylint: disable=g-import-not-at-top
      raise InvalidRequestError(f'shm_offer takes one argument (pid), got {len(args)}')
    args = courier_guard.accept(args, 'shm_offer')
    return courier_guard.plain(self._node.shm_offer(*args))

  def report_acting(self, report):
    report = courier_guard.accept(report, 'report_acting')
    return courier_guard.plain(self._node.report_acting(report))

  def get_variables(self, names):
    names = courier_guard.accept(names, 'get_variables')
    return courier_guard.plain(self._node.get_variables(names))

  def env_snapshot(self, *args):
    """(round, env ids, blobs or None, why): an actor's envs at a checkpoint round
    (`seedacme.run.resume`); the blobs are kept as bytes, never unpickled here."""
    args = courier_guard.accept(args, 'env_snapshot')
    return courier_guard.plain(self._node.env_snapshot(*args))

  def resume_envs(self, *args):
    """(env ids): those envs' snapshots for an exact resume, or None."""
    args = courier_guard.accept(args, 'resume_envs')
    return courier_guard.plain(self._node.resume_envs(*args))

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
