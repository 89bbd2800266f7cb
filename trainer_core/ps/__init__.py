"""The parameter-server roles: scheduler, server (with its pure store), the worker-side client,
membership, liveness and sharding. Built on ``trainer_core.transport``; knows nothing of the
KV API or of training.
"""
