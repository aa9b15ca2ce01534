"""From served steps to Reverb and back: sequence assembly, the Reverb writer and its
reconnect protocol, the sink contract, the learner's datasets, what counts as the
server being away.
"""
