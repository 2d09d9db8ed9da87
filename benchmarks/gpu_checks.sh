#!/usr/bin/env bash
# The checks that need a GPU, as one prepared script for a lent GPU machine (docs/performance.md,
# "On a GPU"). That machine has torch and CUDA but no verl and no network, so verl and what it needs
# travel as wheels for its Python in .whl/ (see docs/performance.md for how they were made).
#
#   OUT=runs/gpu bash benchmarks/gpu_checks.sh
#
# Each stage has its own time limit and writes its output to $OUT; a failing stage does not stop
# the next one. STAGES picks some (default: install pytest_cuda bench_target bench_grid e2e_cuda);
# e2e_colocate trains 2 steps in colocate_async, and e2e_separate asks separate_async for a second
# GPU, which one GPU cannot give: the launcher must refuse it before Ray waits.
set -uo pipefail
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 WANDB_MODE=disabled
STAGES=${STAGES:-install pytest_cuda bench_target bench_grid e2e_cuda}

stage() {  # stage NAME SECONDS COMMAND...: run COMMAND under a time limit, keep its output
    local name=$1 limit=$2; shift 2
    [[ " $STAGES " == *" $name "* ]] || return 0
    echo "=== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 40 "$OUT/$name.txt"
}

stage install 120 bash -c 'python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
    && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv \
    && python3 -c "import torch, verl, verl_avspo; print(torch.__version__, torch.version.cuda, verl.__version__, torch.cuda.get_device_name())"'
stage pytest_cuda 90 python3 -m pytest -q -p no:cacheprovider tests/benchmarks/test_bench_advantage.py tests/core/test_advantage.py
stage bench_target 90 python3 benchmarks/bench_advantage.py --device cuda --sizes 8k --lengths 4k --groups 8 --repeats 15
stage bench_grid 150 python3 benchmarks/bench_advantage.py --device cuda
stage e2e_cuda 240 python3 tests/e2e/run_cpu_ppo.py --device cuda --steps 2 --out /tmp/e2e_cuda
cp /tmp/e2e_cuda/metrics.log "$OUT/e2e_cuda_console.log" 2>/dev/null || true
stage e2e_colocate 240 python3 tests/e2e/run_cpu_ppo.py --device cuda --steps 2 --mode colocate_async --out /tmp/e2e_colocate
stage e2e_separate 60 python3 tests/e2e/run_cpu_ppo.py --device cuda --steps 2 --mode separate_async --out /tmp/e2e_separate
