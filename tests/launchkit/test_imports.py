"""What the CLI loads: every launch reads every backend's declarations (its flags), and only the
ssh backend's run needs fabric (with paramiko and invoke: about a third of the CPU a short
``launchkit`` command took), so reading them loads none of it. Each case runs in a fresh Python,
the way a user's command starts."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("fabric", "paramiko", "invoke")


def loaded_after(code: str) -> list[str]:
    """Which of HEAVY a fresh Python has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_the_cli_and_every_backends_declarations_load_no_fabric() -> None:
    code = (
        "import launchkit.cli, launchkit.launching\n"
        "from launchkit import backends\n"
        "backends.engine_flags()\n"
        "[backends.capabilities(name) for name in backends.names()]\n"
    )
    assert loaded_after(code) == []


def test_the_ssh_connection_loads_it() -> None:
    """The probe sees an import of fabric where there is one."""
    assert loaded_after("import launchkit.backends.ssh.connection") == list(HEAVY)
