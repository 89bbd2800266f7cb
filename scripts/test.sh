#!/usr/bin/env bash
# Set up what the tests need on a fresh Debian 12 machine, then run lint, types and tests.
#   bash scripts/test.sh [PYTEST ARGS...]           everything (CI runs this)
#   bash scripts/test.sh --quick [PYTEST ARGS...]   lint, types and the tiers that need no engine
# The full run installs (as root, when missing) the Debian packages the test fixtures use (Open MPI,
# Slurm and munge for the engine tests; g++ builds the CUDA kernels' bodies on the host for their
# tests; Grid Engine through scripts/install-gridengine.sh), creates .venv with launchkit's test,
# fast and torch extras, makes the MXNet 1.9.1 venv of the compatibility tests, then runs ruff,
# mypy and pytest. --quick installs only what the unit and proc tiers need (the local tools below
# and the test extra: no engine, no sshd, no MXNet, no torch, whose tests then skip) and runs
# `pytest -m "(unit or proc) and not slow"`, with mypy beside it, in two workers per core
# (pytest-xdist). The unit, proc and gpu tiers run a worker per core, the longest tests first, then
# the cluster and compat tiers in workers grouped by the engine their tests hold (a namespace-host
# subnet per worker); pytest's cache is on: --lf and --ff work. docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
if [ "${1:-}" = "--quick" ]; then
    quick=1
    shift
fi

# (openmpi-bin: the mpi backend's dry runs, proc tier, ask mpirun --version)
DEBS=(procps iproute2 tmux util-linux openssh-client rsync libgomp1 libquadmath0 g++ openmpi-bin)
EXTRAS=test
if [ $quick -eq 0 ]; then
    DEBS+=(openssh-server mpich slurm-wlm munge)
    EXTRAS=test,fast,torch
fi
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

[ $quick -eq 1 ] || [ ! -f scripts/install-gridengine.sh ] || bash scripts/install-gridengine.sh

# pip runs when pyproject.toml changed or an extra is missing since the last install (.venv/installed)
[ -x .venv/bin/python ] || python3 -m venv .venv
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $EXTRAS"
have=$(cat .venv/installed 2>/dev/null || true)
if [ "$have" != "$want" ] && ! { [ $quick -eq 1 ] && [ "${have%% *}" = "${want%% *}" ]; }; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    log=$(mktemp)
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]" >"$log" 2>&1 || { cat "$log"; exit 1; }
    rm -f "$log"
    echo "$want" >.venv/installed
fi
if [ $quick -eq 0 ]; then
    # MXNet 1.9.1 for the compatibility tests, made here rather than inside the first test that
    # asks for it (about a minute on a fresh machine, which that test's 60 s timeout would also
    # have to hold)
    MXNET_VENV=/var/tmp/launchkit-test-venv-mxnet bash scripts/mxnet_venv.sh >/dev/null
fi

echo "[test.sh] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ $quick -eq 1 ]; then
    # --quick: mypy (about 20 s of CPU without its cache) beside pytest, whose workers leave the
    # cores idle part of the time (tests waiting for a process, a timeout, a heartbeat bound)
    mypy_log=$(mktemp)
    .venv/bin/mypy >"$mypy_log" 2>&1 &
    mypy_pid=$!
    trap 'kill $mypy_pid 2>/dev/null || true; rm -f "$mypy_log"' EXIT  # (pytest interrupted: mypy too)
else
    echo "[test.sh] mypy"
    .venv/bin/mypy
fi
echo "[test.sh] pytest"
# the unit, proc and gpu tiers: a worker per core (pytest-xdist), the longest tests first
# (tests/ordering.py); `-n 0` among the arguments runs them in this process, `-n 4` four workers.
# --quick stops there (without the slow ones), with two workers per core: its tests wait for
# processes to start, for a timeout or a heartbeat bound, leaving a core idle part of the time
parallel=(-n auto)
if [ $quick -eq 1 ]; then
    parallel=(-n "$((2 * $(nproc)))")
    rc=0
    .venv/bin/python -m pytest -q "${parallel[@]}" -m "(unit or proc) and not slow" "$@" || rc=$?
    rc_mypy=0
    wait $mypy_pid || rc_mypy=$?
    echo "[test.sh] mypy"
    cat "$mypy_log"
    [ $rc -ne 0 ] && exit $rc
    exit $rc_mypy
fi
# (--durations: each phase ends with its 25 slowest tests, where the run's time goes)
rc=0
.venv/bin/python -m pytest -q "${parallel[@]}" --durations=25 -m "not cluster and not compat" "$@" || rc=$?
[ $rc -eq 5 ] && rc=0  # (arguments that select no test of these tiers)
# then the cluster and compat tiers, in a session of their own (their bounds are set for a
# machine that runs nothing else of the suite beside them): in workers that each run what one
# resource holds (Grid Engine, the session's Slurm; each engine started once) and share the rest,
# the namespace hosts' tests included (each worker has a subnet of its own), tests/cluster/groups.py
echo "[test.sh] pytest: the cluster and compat tiers"
rc2=0
.venv/bin/python -m pytest -q -n 3 --dist loadgroup --durations=25 -m "cluster or compat" "$@" || rc2=$?
[ $rc2 -eq 5 ] && rc2=0
[ $rc -ne 0 ] && exit $rc
exit $rc2
