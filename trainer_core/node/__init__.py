"""The node layer: what every node of a job does whatever it computes (ps-lite's Postoffice and
Customer). Joining through the scheduler, the book of all nodes, liveness, barriers, aborts and
request tracking, on ``trainer_core.transport``'s channels; the parameter server (``ps``) and the
collectives (``collective``) are built on it and never import each other.
"""
