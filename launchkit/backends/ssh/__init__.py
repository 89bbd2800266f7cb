"""The ssh backend: the user's ssh options (``options``), fabric connections (``connection``), the
host agent that drives one host's watchdog (``agent``), a host's output into local pipes
(``feed``), worker 0's host for a job without servers (``worker0``), working-directory sync
(``sync``), one-shot commands over many hosts as a fabric group (``commands``) and the backend
itself (``backend``)."""

#: the exit code of a process whose host's connection was lost (as ssh reports it); here, not in
#: ``agent``, so that the launcher reads it without importing fabric
LOST_EXIT = 255

#: seconds a lost host's watchdog is given, after its heartbeat timeout and the grace period, for
#: its word ``lost`` (1 s at most) and its final sweep by job id (a new process of the job there
#: waits for it: that sweep would end it too)
WATCHDOG_SWEEP = 3.0
