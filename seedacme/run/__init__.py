"""A run's account and record: acting (steps, episodes, returns), the monitor (progress,
budgets, targets, the summary), progress files, curves, logdir reading.
"""
