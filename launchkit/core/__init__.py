"""The pure core: what a job is (``spec``), what a backend declares it can do (``capabilities``),
hostfiles, placement and the launch plan.

No sockets, processes or files here beyond reading a hostfile: every function takes values and
returns values, so the rest of launchkit (and its tests) can rely on them without a cluster.
"""
