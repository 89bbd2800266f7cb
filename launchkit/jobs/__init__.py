"""Jobs after they start: records on disk (``records``), finding and ending them (``kill``,
``detached`` for jobs an engine runs on its own), and the reaper that ends a job whose launcher died."""
