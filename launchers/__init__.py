"""Ways to launch a seedacme program; nothing else in the code knows how it is launched.

    python -m seedacme.launchers.local catch vtrace 2     # or: run_local catch vtrace 2
    python -m seedacme.launchers.vertex atari vtrace 64 --dry_run    # Vertex AI
    python -m seedacme.launchers.cluster catch vtrace 2 --dry_run    # your own machines
"""
