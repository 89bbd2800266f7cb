"""The parameter-server roles: scheduler, server (a poll loop around ``handler.RequestHandler`` and
its pure ``store``), the worker-side client (with ``routes``: which channel reaches each server),
membership, liveness and sharding. Built on ``trainer_core.transport``'s channel interface, never
on a particular transport's API; knows nothing of the KV API or of training.
"""
