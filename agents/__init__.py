"""Agents for seedacme: each a config dataclass, networks, pure losses, a learner and a
builder that tells the SEED machinery which tables, trajectories and policy to use.

    from seedacme.agents import vtrace
    builder = vtrace.VTraceBuilder(vtrace.VTraceConfig())
"""
