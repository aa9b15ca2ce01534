"""The central node as a supervised process: Launchpad's node supervises, a child serves.

`SupervisedCentralNode` is what the program adds for the learner group when
`ProgramConfig.supervise` is set: its Launchpad process only supervises
(`seedacme.runtime.supervisor.Supervisor`), passes the pickled `CentralNode` arguments
through as bytes and never imports TensorFlow; the child (`serve_central`) builds the
`CentralNode` and serves Courier on the node's port, so a restarted child binds the same
address and actors reconnect. The child marks `tf_imported` and `serving`
(`seedacme.runtime.startup`; `CentralNode` marks the phases between).

Its planned stop (SIGTERM) gives the child `CENTRAL_STOP_TIMEOUT_S` before it is killed,
not the 6 s other nodes get: `CentralNode.finish` may wait `LEARNER_JOIN_S` for the
learner's step in flight and then writes the last checkpoint. It stays under the 10 s
after which Launchpad kills a node's processes (`lp_termination_notice_secs`).
"""

import threading
from typing import Any, Dict

import cloudpickle
import launchpad as lp
from launchpad.nodes import dereference as lp_dereference
import tree

from seedacme.runtime import startup
from seedacme.runtime.supervisor import Supervisor, exit_node

# What a standby child imports ahead of need (the order `serve_central` uses).
STANDBY_IMPORTS = ('seedacme.nodes.central_imports',)
# The central child's grace after SIGTERM: the learner join of `finish` (4 s), the
# summary, the last checkpoint and Courier's stop (module docstring).
CENTRAL_STOP_TIMEOUT_S = 9.0


def serve_central(stop_event: threading.Event, port: int, courier_kwargs: Dict[str, Any],
                  payload: bytes, replay_address: str, **handles) -> None:
  """Entry point of a (supervised) central process: the node and its Courier server.

  `payload` is the pickled rest of `CentralNode`'s arguments (builder, spec, config):
  the supervisor forwards it as bytes, so only this process imports TensorFlow: it
  loads the pip-installed CUDA libraries first, if any (`seedacme.runtime.cuda_libs`).
  """
  # CUDA libraries first, then TF, Reverb and the node: the order a standby also uses.
  from seedacme.nodes import central_imports as imports  # pylint: disable=g-import-not-at-top
  startup.mark('learner', 'tf_imported')
  node = imports.central.CentralNode(
      stop_event=stop_event, replay=imports.reverb.Client(replay_address),
      **cloudpickle.loads(payload), **handles)
  server = imports.central.make_central_server(node, port=port, **courier_kwargs)
  server.Start()
  startup.mark('learner', 'serving')
  try:
    node.run()
  finally:
    server.Stop()
    server.Join()


class SupervisedCentralNode(lp.CourierNode):
  """The central node's Courier address, served by a supervised child process.

  The Launchpad process only supervises: it passes the pickled arguments (builder,
  spec, config) through as bytes and never imports TensorFlow; the child builds the
  `CentralNode` and serves Courier on this node's port (`serve_central`).
  """

  def __init__(self, standby: bool = False, **kwargs):
    super().__init__(dict, **kwargs)  # the real constructor runs in the child
    self._standby = standby

  def run(self) -> None:
    args, kwargs = tree.map_structure(lp_dereference.maybe_dereference,
                                      (self._args, self._kwargs))
    del args
    kwargs.update(port=lp.get_port_from_address(self._address.resolve()),
                  courier_kwargs=self._courier_kwargs,
                  replay_address=kwargs['replay_address'].resolve())
    central_supervisor(kwargs, standby=self._standby).run()
    exit_node()


def central_supervisor(kwargs: Dict[str, Any], standby: bool = False,
                       stop_event: threading.Event | None = None) -> Supervisor:
  """The supervisor of a central node's child: `serve_central(**kwargs)`, with the
  central node's grace and, with `standby`, a standby child."""
  return Supervisor(serve_central, kwargs, 'learner', stop_event=stop_event,
                    stop_timeout_s=CENTRAL_STOP_TIMEOUT_S,
                    standby_imports=STANDBY_IMPORTS if standby else ())
