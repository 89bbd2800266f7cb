"""First-use time of the compiled compression kernels: compiled cold, loaded from numba's cache,
and on a read-only install (cache in the user's cache directory).

Usage: ``python bench/kernel_compile.py [--repeat 3] [--no-read-only]``

Every cell is a fresh Python process (numba imported before the clock starts) that calls one
compression type's encode kernel and then its decode kernel once on 4099 float32 values, timing
each first call: that is the compile (cold: an empty ``NUMBA_CACHE_DIR``) or the load from the
cache (warm: the same directory again). The first kernel call of a process also pays numba's
one-time dispatcher set-up, so each type runs in a process of its own. ``all (warm)`` is
``kernels.warm`` of the three types in one process, what a worker's ``set_gradient_compression``
costs. The read-only rows (root, ``unshare -m``) copy ``trainer_core`` onto a read-only bind
mount with a fresh HOME, so numba caches in ``~/.cache/numba``. Medians of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TYPES = {"2bit": {"type": "2bit", "threshold": 0.5}, "1bit": {"type": "1bit"}, "topk": {"type": "topk"}}

ONE = """
import json, sys, time
import numba, numpy as np
from trainer_core.compression import get_compressor
c = get_compressor(json.loads(sys.argv[1]))
g = np.linspace(-1, 1, 4099, dtype=np.float32)
t0 = time.perf_counter()
p, m = c.encode(g)
t1 = time.perf_counter()
c.decode(p, m, g.shape, g.dtype, out=np.empty_like(g))
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""

ALL = """
import json, time
import numba
from trainer_core.compression import kernels
t = time.perf_counter()
for p in PARAMS:
    kernels.warm(p)
print(json.dumps([time.perf_counter() - t, 0.0]))
""".replace("PARAMS", repr(list(TYPES.values())))


def run(code: str, arg: str, env: dict[str, str], read_only: Path | None) -> list[float]:
    if read_only is None:
        cmd = [sys.executable, "-c", code, arg]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=REPO).stdout
    else:
        src, mnt, home = read_only / "src", read_only / "mnt", read_only / "home"
        script = (
            f"mount --bind -o ro {src} {mnt} && cd {mnt} && HOME={home} PYTHONPATH={mnt} "
            f'{sys.executable} -c "$0" "$1"'
        )
        out = subprocess.run(
            ["unshare", "-m", "sh", "-c", script, code, arg],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return json.loads(out.splitlines()[-1])


def measure(repeat: int, read_only: bool) -> dict[str, dict[str, list[float]]]:
    res: dict[str, dict[str, list[float]]] = {}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
    base["PYTHONPATH"] = str(REPO)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            ro: Path | None = None
            env = dict(base)
            if read_only:
                ro = Path(tmp)
                (ro / "mnt").mkdir()
                (ro / "home").mkdir()
                shutil.copytree(
                    REPO / "trainer_core",
                    ro / "src" / "trainer_core",
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
            else:
                env["NUMBA_CACHE_DIR"] = tmp
            for name, params in [*TYPES.items(), ("all", None)]:
                code, arg = (ALL, "") if params is None else (ONE, json.dumps(params))
                for phase in ("cold", "warm"):
                    if params is None and phase == "cold":
                        continue
                    t = run(code, arg, env, ro)
                    cell = res.setdefault(f"{name} ({phase})", {"encode": [], "decode": []})
                    cell["encode"].append(t[0])
                    cell["decode"].append(t[1])
    return res


def table(res: dict[str, dict[str, list[float]]], title: str) -> str:
    rows = [f"| {title} | encode kernel s | decode kernel s |", "|---|---|---|"]
    for name, cell in res.items():
        enc, dec = statistics.median(cell["encode"]), statistics.median(cell["decode"])
        if name.startswith("all"):
            rows.append(f"| {name}: kernels.warm of 2bit, 1bit, topk in one process | {enc:.3f} | |")
        else:
            decode = "numpy (no kernel)" if name.startswith("topk") else f"{dec:.3f}"
            rows.append(f"| {name} | {enc:.3f} | {decode} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-read-only", action="store_true")
    args = ap.parse_args()
    import numba

    print(f"numba {numba.__version__}, Python {sys.version.split()[0]}, medians of {args.repeat}\n")
    print(table(measure(args.repeat, False), "installed in a writable place"))
    if not args.no_read_only and os.geteuid() == 0 and shutil.which("unshare"):
        print()
        print(table(measure(args.repeat, True), "read-only install (cache in ~/.cache/numba)"))


if __name__ == "__main__":
    main()
