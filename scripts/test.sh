#!/usr/bin/env bash
# Set up everything the tests need on a fresh Debian 12 machine, then run lint, types and tests.
#   bash scripts/test.sh [PYTEST ARGS...]
# Installs (as root, when missing) the Debian packages the test fixtures use, creates .venv,
# (Open MPI, Slurm and munge for the engine tests; g++ builds the CUDA kernels' bodies on the host
# for their tests; Grid Engine through scripts/install-gridengine.sh),
# installs launchkit with its test extra and the MXNet 1.9.1 venv of the compatibility tests,
# then runs ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(procps iproute2 tmux util-linux openssh-server openssh-client rsync libgomp1 libquadmath0
      openmpi-bin mpich slurm-wlm munge g++)
missing=()
for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[test.sh] installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ ! -f scripts/install-gridengine.sh ] || bash scripts/install-gridengine.sh

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
log=$(mktemp)
.venv/bin/python -m pip install -q -e '.[test,fast,torch]' >"$log" 2>&1 || { cat "$log"; exit 1; }
rm -f "$log"
# MXNet 1.9.1 for the compatibility tests, made here rather than inside the first test that asks
# for it (about a minute on a fresh machine, which that test's 60 s timeout would also have to hold)
MXNET_VENV=/var/tmp/launchkit-test-venv-mxnet bash scripts/mxnet_venv.sh >/dev/null

echo "[test.sh] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "[test.sh] mypy"
.venv/bin/mypy
echo "[test.sh] pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
