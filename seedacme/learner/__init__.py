"""The training side of the central node: the Learner contract, the loop that steps it,
checkpoints and the policy export.
"""
