"""The pure core: what a job is (``spec``), hostfiles, placement and the launch plan.

No sockets, processes or files here beyond reading a hostfile: every function takes values and
returns values, so the rest of launchkit (and its tests) can rely on them without a cluster.
"""
