"""``--sync-dst-dir``: rsync the working directory to every host in parallel, with progress.

One ``rsync -az`` per host (at most 32 at a time) over the same ssh options as the launch. Failures are collected per
host and are fatal: a launch never starts with half-synced hosts.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from launchkit.backends.ssh.connection import on_each
from launchkit.backends.ssh.options import SshOptions
from launchkit.core.spec import Host
from launchkit.errors import BackendError

_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+(\d+)%")


def rsync_argv(src: str, host: Host, dst: str, opts: SshOptions, excludes: Sequence[str] = ()) -> list[str]:
    """The rsync command for one host (pure). ``src`` is synced as a directory's contents."""
    target = f"{host.address}:{dst.rstrip('/')}/"
    if ":" in host.name:  # IPv6: rsync wants brackets
        target = f"{host.user + '@' if host.user else ''}[{host.name}]:{dst.rstrip('/')}/"
    argv = ["rsync", "-az", "--mkpath", "--info=progress2", "--no-inc-recursive"]
    argv += [f"--exclude={pat}" for pat in excludes]
    argv += ["-e", shlex.join(opts.ssh_command(host)), src.rstrip("/") + "/", target]
    return argv


@dataclass
class SyncResult:
    host: Host
    code: int
    error: str


def sync_all(
    hosts: Sequence[Host], src: str, dst: str, opts: SshOptions, excludes: Sequence[str], console: Console
) -> list[SyncResult]:
    """rsync ``src`` to ``dst`` on every host in parallel (at most MAX_PARALLEL at a time); raises
    BackendError if any failed."""
    with Progress(
        TextColumn("sync {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:

        def one(host: Host) -> SyncResult:
            bar = progress.add_task(str(host), total=100)
            argv = rsync_argv(src, host, dst, opts, excludes)
            try:
                proc = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
                )
            except FileNotFoundError:
                return SyncResult(host, 127, "rsync is not installed on this machine")
            assert proc.stdout is not None and proc.stderr is not None
            buf = b""
            while chunk := os.read(proc.stdout.fileno(), 4096):
                buf += chunk
                *parts, buf = re.split(rb"[\r\n]", buf)
                for part in parts:
                    m = _PROGRESS.match(part)
                    if m:
                        progress.update(bar, completed=int(m.group(2)))
            err = proc.stderr.read().decode(errors="replace").strip()
            code = proc.wait()
            if code == 0:
                progress.update(bar, completed=100)
            return SyncResult(host, code, err)

        results = on_each(one, hosts)
    failed = [r for r in results if r.code != 0]
    if failed:
        lines = "; ".join(
            f"{r.host}: rsync exit {r.code}: {r.error.splitlines()[-1] if r.error else ''}" for r in failed
        )
        raise BackendError(
            "ssh", f"sync to {len(failed)} of {len(hosts)} host(s) failed, nothing started: {lines}"
        )
    return results


def source_dir() -> str:
    return str(Path.cwd())
