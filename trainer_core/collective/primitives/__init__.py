"""What the collective algorithms are written against: the point-to-point interface and its tag
namespaces (``links``), the reduction operators (``reduce``), an operation's operands checked (``operands``), and the shared-memory segment of a
host's ranks with the counters that order their steps (``hostsegment``, sleeping on ``futex``).
They import nothing else of the package."""
