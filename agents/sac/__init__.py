"""Soft actor-critic (Haarnoja et al., 2018) on the SEED core, for continuous control.

Files follow the data flow: `config`, `networks` (a tanh-Normal actor: the shared head
of seedacme/distributions.py; twin critics and their Polyak targets; the temperature),
`acting` (the batched server-side policy), `losses` (pure functions), `learning` (n-step
targets, critic, actor and temperature updates on uniform replay), `builder`.
"""

from seedacme.agents.sac.config import SACConfig
from seedacme.agents.sac.builder import SACBuilder

__all__ = ['SACConfig', 'SACBuilder']
