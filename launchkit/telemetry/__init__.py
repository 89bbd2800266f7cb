"""The job's telemetry as the launcher sees it: what every process reports over the metrics
endpoint, and what every host's sampler reports about the host (``model``); the endpoint and
the launcher host's sampler (``endpoint``); the training panel's figures from the model (``view``,
pure)."""
