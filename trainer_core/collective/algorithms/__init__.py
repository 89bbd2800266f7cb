"""The collective algorithms, each written against the point-to-point interface
(``primitives.links.Links``), the reduction operators (``primitives.reduce``) and, for the
shared-memory ones, the host's segment (``primitives.hostsegment``); nothing else of the package
(docs/collectives.md)."""
