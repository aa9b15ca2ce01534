"""R2D2 (Kapturowski et al., 2019) on the SEED core.

`networks` (LSTM Q-network, optional dueling head), `acting` (server-side per-env
epsilon-greedy), `losses` (value rescaling, n-step double-Q targets, priorities: pure TF
functions), `priorities` (the same targets in numpy, for initial priorities computed by the
inference server), `learning` (burn-in, SGD, target network, priority updates), `builder`.
"""

from seedacme.agents.r2d2.config import R2D2Config
from seedacme.agents.r2d2.builder import R2D2Builder

__all__ = ['R2D2Config', 'R2D2Builder']
