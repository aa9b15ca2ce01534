"""What crosses between actors and the inference server: the request format and its
validation (protocol), the same request in shared memory (shm), actor-side acting
reports (reports).
"""
