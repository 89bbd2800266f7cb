"""``NetLinks``: the collectives' ``Links`` between the worker processes of a job, over the node
layer's channels (docs/collectives.md, "Over sockets").

* ``netlinks``: the links themselves: a channel to every other worker, one receiving thread that
  matches each message to its posted receive, the failure of a peer (told to the scheduler) and
  the ``Links`` calls;
* ``handles``: a posted receive (``Recv``), a completed send (``DONE``) and the eventfd that wakes
  the receiving thread;
* ``channels``: opening the channel to a worker (same-host or TCP), and the same-host messages
  whose bytes travel in a memfd;
* ``sharesegment``: the host's shared-memory segment, made by its lowest rank and handed to the
  others over their channels;
* ``protocol``: the collectives' own messages on those channels.

On the primitives (``links``, ``hostsegment``), the node layer and the transport; only
``collective.job`` imports this package.
"""
