#!/usr/bin/env bash
# Create, once, the virtual environment with the real MXNet 1.9.1 (CPU wheel, with the
# distributed KV store) used by the compatibility tests and the peer benchmarks, and print the
# path of its python. MXNET_VENV overrides the location (default: .venv-mxnet in the repo).
# The ssh compatibility tests put it in /var/tmp, which the network-namespace hosts share.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${MXNET_VENV:-.venv-mxnet}
# MXNet's CPU wheel links against the system's OpenMP and quad-precision math runtimes
for pkg in libgomp1 libquadmath0; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed"; then
        SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$pkg" >&2
    fi
done
exec 9>"$V.lock"
flock 9
if ! "$V/bin/python" -m pip show -q mxnet >/dev/null 2>&1; then
    echo "[mxnet_venv] creating $V with mxnet==1.9.1 (about a minute)" >&2
    # Debian's python3 where there is one: a venv of it works inside the test hosts too (a
    # pyenv interpreter under /root would be hidden by their private /root)
    PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
    "$PY" -m venv "$V" >&2
    "$V/bin/python" -m pip install -q --upgrade pip >&2
    "$V/bin/python" -m pip install -q "mxnet==1.9.1" "numpy<1.24" >&2
fi
echo "$(cd "$V" && pwd)/bin/python"
