"""Unusable ``LAUNCHKIT_HOME`` directories, made the same way for every test that refuses them."""

from __future__ import annotations

from pathlib import Path

KINDS = ("file", "dangling link", "jobs is a file", "not creatable")


def odd_home(kind: str, tmp_path: Path) -> Path:
    """Make a home of ``kind`` under ``tmp_path``; return the path that a refusal must name."""
    home = tmp_path / "odd-home"
    if kind == "file":
        home.write_text("")
    elif kind == "dangling link":
        home.symlink_to(tmp_path / "nowhere")
    elif kind == "jobs is a file":
        home.mkdir()
        (home / "jobs").write_text("")
    elif kind == "not creatable":
        home = Path("/proc/self/odd-home")  # a directory no one, root included, can create
    else:
        raise ValueError(f"unknown kind of home {kind!r}; expected one of {', '.join(KINDS)}")
    return home
