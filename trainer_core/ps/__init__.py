"""The parameter server, on the node layer (``trainer_core.node``): its protocol (``protocol``), the
scheduler and server roles (a poll loop around ``handler.RequestHandler`` and its pure ``store``),
the worker-side client (with ``routes``: which channel reaches each server) and sharding. Built
on ``trainer_core.transport``'s channel interface, never on a particular transport's API; knows
nothing of the KV API or of training, and never imports ``trainer_core.collective``.
"""
