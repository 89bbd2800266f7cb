"""What the user said about ssh (``-i``, ``--ssh-port``, ``--known-hosts``, ...), as one frozen value.

Pure data, light to import: the command line, the job records, the mpi backend and rsync's ``-e``
use it without loading fabric, which only ``connection`` (and what opens connections) imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launchkit.core.spec import Host


@dataclass(frozen=True)
class SshOptions:
    port: int | None = None  # --ssh-port: default for hosts without their own port
    identity: str | None = None  # -i/--identity
    known_hosts: str | None = None  # default ~/.ssh/known_hosts
    strict_host_keys: bool = False
    connect_timeout: float = 10.0
    config_file: str | None = None  # default ~/.ssh/config

    def known_hosts_path(self) -> Path:
        return Path(self.known_hosts or Path.home() / ".ssh" / "known_hosts").expanduser()

    def config_path(self) -> Path:
        return Path(self.config_file or Path.home() / ".ssh" / "config").expanduser()

    def ssh_command(self, host: Host) -> list[str]:
        """The system ``ssh`` argv prefix with the same options (for rsync's ``-e``)."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.connect_timeout)}"]
        argv += ["-o", f"StrictHostKeyChecking={'yes' if self.strict_host_keys else 'accept-new'}"]
        argv += ["-o", f"UserKnownHostsFile={self.known_hosts_path()}"]
        port = host.port or self.port
        if port:
            argv += ["-p", str(port)]
        if self.identity:
            argv += ["-i", str(Path(self.identity).expanduser())]
        if self.config_file:
            argv += ["-F", self.config_file]
        return argv
