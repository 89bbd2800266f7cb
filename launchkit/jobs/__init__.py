"""Jobs after they start: records on disk (``records``), finding and ending them (``kill``,
``detached`` for jobs an engine runs on its own), the reaper that ends a job whose launcher died,
the live file ``top`` and ``ps`` read (``live``) and every process's kept output (``outputs``)."""
