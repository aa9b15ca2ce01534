"""The env-only actor (env_actor), how it steps its K envs (engines), how its requests
reach the server (transport), and actor-side inference, the Acme baseline
(actor_side).
"""
