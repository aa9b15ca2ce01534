"""Agents by name, with per-environment defaults (what `run_local <env> <agent>` uses)."""

from typing import Any, Dict

from seedacme.builder import SeedBuilder

AGENT_NAMES = ('vtrace',)

# Per-environment overrides of the agent's config dataclass.
_VTRACE_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'catch': dict(network='mlp', hidden_sizes=(64, 64), unroll_length=20, batch_size=32,
                  learning_rate=1e-3, entropy_cost=0.01),
    'cartpole': dict(network='mlp', hidden_sizes=(64, 64), unroll_length=20,
                     batch_size=32, learning_rate=1e-3, entropy_cost=0.01,
                     reward_scale=0.1),
}


def make_builder(agent: str, env: str, **overrides) -> SeedBuilder:
  """The builder of `agent` configured for `env` (plus explicit overrides)."""
  if agent == 'vtrace':
    from seedacme.agents import vtrace  # pylint: disable=g-import-not-at-top
    kwargs = {**_VTRACE_DEFAULTS.get(env, {}), **overrides}
    return vtrace.VTraceBuilder(vtrace.VTraceConfig(**kwargs))
  raise ValueError(f'Unknown agent {agent!r}; known: {", ".join(AGENT_NAMES)}')
