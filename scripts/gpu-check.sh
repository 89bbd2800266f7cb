#!/usr/bin/env bash
# Every cupy and CUDA path of trainer_core on a real GPU, with its logs and tables in one folder.
#   bash scripts/gpu-check.sh [OUT_DIR]        (default: $OUT, else ./gpu-check-out)
#   GPU_CHECK_BENCH=0 bash scripts/gpu-check.sh   (the tests only)
#
# For a GPU machine that already has Python with cupy, torch, numba, numpy, typer, rich, pytest
# and pytest-timeout, and reaches no package registry: the project's other dependencies (pyzmq,
# paramiko, fabric, ...) come as wheels in .whl/ at the checkout's root (docs/testing.md, "On a GPU
# machine", says how to fetch them) and are installed into a private folder; the project itself
# runs from the checkout.
# Without a usable GPU it says so and exits with status 2 at once; it exits 1 where a test or a
# bench fails (each bench still runs; a failed one is noted in bench.md), or the wheels do not
# install or import; 0 where everything passed.
#
# What it runs (about 2.5 minutes on an H200, 2026-11-27; the tests alone 91-130 s):
#   1. nvidia-smi and the versions of the Python packages and of NCCL          -> env.txt
#   2. the GPU tests, each with a timeout: the CUDA kernels against the host kernels, the optimizer
#      rules, the KV store and the collectives on cupy arrays, NCCL, torch's CUDA tensors, jobs of
#      2 workers and 2 servers pushing cupy gradients, torch jobs on CUDA      -> tests.log, junit.xml
#   3. bench/compression_gpu.py at 1e5..1e8 float32 and bench/gpu_transfers.py -> bench.md, *.json
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out"

if ! python3 -c 'import cupy; cupy.zeros(1).sum().item()' >"$out/no-gpu.txt" 2>&1; then
    echo "gpu-check: cupy has no usable GPU here: $(tail -n 1 "$out/no-gpu.txt")" >&2
    exit 2
fi
rm -f "$out/no-gpu.txt"

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-check-site .whl/*.whl || { echo "gpu-check: installing .whl/ failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/gpu-check-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import zmq, fabric, typer, rich, numba' || { echo "gpu-check: a dependency is missing (above)" >&2; exit 1; }

{
    date -u
    nvidia-smi
    python3 - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("numpy", "cupy", "torch", "numba", "zmq", "fabric"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(name, "not importable:", exc)
import cupy
print("CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
try:
    from cupy.cuda import nccl
    print("NCCL", nccl.get_version())
except Exception as exc:
    print("NCCL not loaded:", exc)
import torch
print("torch CUDA", torch.version.cuda, torch.cuda.get_device_name(0))
EOF
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

status=0
python3 -m pytest -q -p no:cacheprovider --timeout 300 -rs -o console_output_style=classic \
    --junitxml "$out/junit.xml" \
    tests/trainer_core/test_compression_cuda.py tests/trainer_core/test_gpu.py \
    tests/trainer_core/test_gpu_jobs.py tests/trainer_core/test_collective_nccl.py \
    tests/trainer_core/test_xp.py 2>&1 | tee "$out/tests.log" | tail -n 40
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then  # the tests alone (a rerun after a fix)
    exit $status
fi
# Each bench runs in this shell (not in a piped group, whose status a subshell would keep), so a
# failed one sets status; its output goes to the terminal and bench.md, its failure noted in both.
: >"$out/bench.md"
bench() {
    timeout 120 "$@" 2>&1 | tee -a "$out/bench.md"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "gpu-check: bench failed (exit $rc): $*" | tee -a "$out/bench.md" >&2
        status=1
    fi
    echo | tee -a "$out/bench.md"
}
for n in 1e5 1e6 1e7 1e8; do
    bench python3 bench/compression_gpu.py --n "$n" --repeat 11 --no-mxnet --json "$out/comp-$n.json"
done
bench python3 -m bench.gpu_transfers --n 1e7 --steps 10 --json "$out/transfers.json"
python3 - "$out" <<'EOF' || status=1
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
parts = sorted(d.glob("comp-*.json"))
json.dump({p.stem: json.loads(p.read_text()) for p in parts}, open(d / "compression.json", "w"), indent=1)
for p in parts:
    p.unlink()
EOF
[ "$status" -eq 0 ] || echo "gpu-check: a test or bench failed (tests.log, bench.md in $out)" >&2
exit $status
