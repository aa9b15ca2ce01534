"""IMPALA's V-trace actor-critic on the SEED core.

Files follow the data flow: `networks` (policy/value nets), `acting` (the batched
server-side policy), `losses` (V-trace as pure functions), `learning` (the SGD step on
unrolls from the Reverb queue), `builder` (wiring for `seedacme.nodes.program`).
"""

from seedacme.agents.vtrace.config import VTraceConfig
from seedacme.agents.vtrace.builder import VTraceBuilder

__all__ = ['VTraceConfig', 'VTraceBuilder']
