"""Process machinery that knows nothing of RL: the supervisor that restarts a node's
work, stop events, device choice, CUDA library preloading.
"""
