"""Central inference: the request batcher, the inference server, the policy contract and
its compiled TF form, and the shared-memory server for same-host actors.
"""
