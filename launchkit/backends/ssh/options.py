"""What the user said about ssh (``-i``, ``--ssh-port``, ``--known-hosts``, ...), as one frozen value.

Pure data, light to import: the command line, the job records, and the system ``ssh`` options it
renders for rsync's ``-e`` and mpirun's ``plm_rsh_args`` need no fabric, which only ``connection``
(and what opens connections) imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchkit.core.flags import EngineFlag, fill, positive
from launchkit.core.spec import Host

#: the flags of ``launchkit launch`` that set ``SshOptions`` (ssh and mpi take them)
CONNECTION_FLAGS = (
    EngineFlag("--ssh-port", "ssh port for hosts that do not name one.", int, fills="port"),
    EngineFlag("-i/--identity", "ssh private key file."),
    EngineFlag("--known-hosts", "Known-hosts file (default ~/.ssh/known_hosts)."),
    EngineFlag("--strict-host-keys", "Refuse hosts not in known_hosts.", bool, False),
    EngineFlag("--connect-timeout", "Seconds to reach each host.", float, 10.0, check=positive),
)


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

    def client_args(self, port: int | None, user: str | None = None) -> list[str]:
        """The same options for the system ``ssh`` client (after ``ssh``; before the host)."""
        args: list[str] = []
        if self.identity:
            args += ["-i", str(Path(self.identity).expanduser())]
        if port:
            args += ["-p", str(port)]
        if user:
            args += ["-l", user]
        args += ["-o", f"UserKnownHostsFile={self.known_hosts_path()}"]  # the file paramiko checks too
        args += ["-o", f"StrictHostKeyChecking={'yes' if self.strict_host_keys else 'accept-new'}"]
        args += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.connect_timeout)}"]
        if self.config_file:
            args += ["-F", self.config_file]
        return args

    def ssh_command(self, host: Host) -> list[str]:
        """The system ``ssh`` argv prefix for ``host`` (rsync's ``-e``; the target names the user)."""
        return ["ssh", *self.client_args(host.port or self.port)]


def from_flags(flags: Mapping[str, Any]) -> SshOptions:
    """The ssh options ``launchkit launch``'s flags give (``CONNECTION_FLAGS``)."""
    return SshOptions(**fill(CONNECTION_FLAGS, flags))
