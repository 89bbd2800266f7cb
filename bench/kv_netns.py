"""The KV round trip across hosts: ``bench/kv.py --netns --repeat 5`` at 1e6 and 1e7 (root).

Usage: ``python -m bench.kv_netns [--repeat 5] [--sizes 1e6,1e7] [--json OUT]``

Three network-namespace hosts (``tests/cluster/netns.py``), servers and workers placed as MXNet's
launcher places them, trainer_core and MXNet 1.9.1 jobs alternated ``--repeat`` times; the issue's
cross-host measurement (see ``bench/kv.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", default="5")
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--configs", default="2x2,4x2")
    ap.add_argument("--json")
    args = ap.parse_args()
    argv = [
        "--netns",
        "--skip-zmq",
        "--repeat",
        args.repeat,
        "--sizes",
        args.sizes,
        "--configs",
        args.configs,
    ]
    sys.argv = [sys.argv[0], *argv, *(["--json", args.json] if args.json else [])]
    kv.main()


if __name__ == "__main__":
    main()
