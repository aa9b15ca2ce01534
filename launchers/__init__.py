"""Ways to launch a seedacme program; nothing else in the code knows how it is launched.

    python -m seedacme.launchers.local catch vtrace 2     # or: run_local catch vtrace 2
"""
