"""The job's telemetry as the launcher sees it: what every process reports over the metrics
endpoint, and what every host's sampler reports about the host (``model``)."""
