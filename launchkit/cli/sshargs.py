"""The ssh files a command that contacts hosts was given (``-i``, ``--known-hosts``, the ssh
config), checked before it does anything: ``kill --all -H`` ends this machine's jobs first, and
``hosts check`` contacts every host, so a key file that is not there was only found out after
that (each host "unreachable", exit 1) instead of said at once (exit 2)."""

from __future__ import annotations

from launchkit.backends.ssh.options import SshOptions
from launchkit.cli.app import path_option


def check_ssh_files(opts: SshOptions) -> None:
    """UsageError naming the flag when ``-i`` or ``--known-hosts`` is empty; exit 2 naming the file
    when the key file cannot be read (``connection.identity_file``, the check a launch makes too)
    or the known-hosts file or the ssh config cannot be read (``fabric_config``)."""
    path_option("-i/--identity", opts.identity)  # (the file options' rule for an empty one)
    path_option("--known-hosts", opts.known_hosts)
    from launchkit.backends.ssh import connection as ssh

    if opts.identity is not None:
        ssh.identity_file(opts.identity)
    ssh.fabric_config(opts)  # the ssh config and the known-hosts file parse (BackendError, exit 2)
