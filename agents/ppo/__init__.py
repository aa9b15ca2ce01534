"""PPO (Schulman et al., 2017) on the SEED core, for discrete and continuous actions.

Files follow the data flow: `config`, `networks` (normalized observation -> torso(s)
-> the shared action head and a value), `acting` (the batched server-side policy),
`losses` (GAE, V-trace advantages, the clipped surrogate and its decoupled form, the
reward normalizer's running return, as pure functions),
`learning` (epochs of minibatches over each batch off the Reverb queue), `builder`.
"""

from seedacme.agents.ppo.config import PPOConfig
from seedacme.agents.ppo.builder import PPOBuilder

__all__ = ['PPOConfig', 'PPOBuilder']
