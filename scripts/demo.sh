#!/usr/bin/env bash
# The main job, on a fresh machine: set up .venv, then train an MLP on the digits data set with
# 4 workers and 2 parameter servers on this machine, with the live dashboard when run in a
# terminal (the plain merged output otherwise).
#   bash scripts/demo.sh [train_digits.py ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
log=$(mktemp)
.venv/bin/python -m pip install -q -e '.[examples]' >"$log" 2>&1 || { cat "$log"; exit 1; }
rm -f "$log"
exec .venv/bin/launchkit launch -n 4 -s 2 --launcher local --dashboard \
    .venv/bin/python examples/train_digits.py --compression 1bit "$@"
