"""The job's live view: ``state`` (what is shown, as data, and its JSON for the live file),
``render`` (the whole view from a state, pure), ``panel`` (the training panel and sparklines)."""
