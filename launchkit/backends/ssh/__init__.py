"""The ssh backend: connections (``connection``), the host agent that drives one host's watchdog
(``agent``), working-directory sync (``sync``), one-shot commands over many hosts (``commands``)
and the backend itself (``backend``)."""
