"""The collective algorithms, each written against ``links.Links`` (see docs/collectives.md)."""
