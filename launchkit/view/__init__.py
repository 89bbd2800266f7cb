"""The job's live view: ``state`` (what is shown, as data, and its JSON for the live file),
``render`` (the whole view from a state, pure), ``panel`` (the training panel and sparklines),
``groups`` (which process rows a frame shows when not all fit: the rest one line per host) and ``snapshot`` (the state of a job
from the supervisor's processes: rows, root cause)."""
