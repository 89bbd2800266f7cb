"""launchkit: a cluster launcher for distributed training jobs (a drop-in for MXNet's tools/launch.py)."""

__version__ = "0.1.0"
