"""Compressed allreduce with error feedback: the two-stage form (``twostage``: compressed
reduce-scatter, then compressed allgather; ``ErrorFeedback`` holds the residuals), its form for
several ranks per host (``hierarchical``: the host's ranks sum in full precision, only the leaders
compress), and PowerSGD's allreduce of its low-rank factors (``lowrank``). On the algorithms, the
primitives and the algorithm choice (``policy``)."""
