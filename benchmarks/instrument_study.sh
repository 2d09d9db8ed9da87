#!/usr/bin/env bash
# The pre-registered study of docs/results.md "Every arm on the calibrated instrument (pre-registered)":
# grpo, avspo (its paper preset), grpo+alloc at budget shares 1 and 0.5, dapo_resample and dapo_resample+skip,
# each over fresh seeds 6000-6009 at the sandbox's calibrated defaults, in its default setting (every step's
# prompts drawn from the levels' whole pools) and in its epochs mode (--train-set 960). Stage "run": the 12
# (setting, arm) invocations, $JOBS at a time, the costliest first; each writes
# $OUT/<setting>/<arm>/runs/<arm>/seed<k>.jsonl. Stage "export": the per-seed CSV beside the page. Stage
# "report": every table and plot recomputed from that CSV alone (benchmarks/instrument_study_report.py).
# Usage: bash benchmarks/instrument_study.sh                 (all three stages)
#        STAGES=report bash benchmarks/instrument_study.sh   (the tables and plots again, from the CSV)
# A smoke test with tiny settings (a few minutes):
#   OUT=runs/smoke CSV=runs/smoke/instrument_study.csv PLOTS=runs/smoke/plots SEEDS=2 TRAIN_SET=16 \
#   SANDBOX_ARGS="--steps 5 --sft-steps 20 --eval-size 8 --eval-every 1" bash benchmarks/instrument_study.sh
set -euo pipefail
export VERL_AVSPO=${VERL_AVSPO:-.venv/bin/verl-avspo}
PYTHON=${PYTHON:-.venv/bin/python}
export OUT=${OUT:-runs/instrument_study}
CSV=${CSV:-docs/results/instrument_study.csv}
PLOTS=${PLOTS:-docs/results}
STAGES=${STAGES:-run export report}
export SEEDS=${SEEDS:-10}
export SEED_START=${SEED_START:-6000}
export TRAIN_SET=${TRAIN_SET:-960}
export SANDBOX_ARGS=${SANDBOX_ARGS:-}
JOBS=${JOBS:-2}
# The costliest arms first, so that the last jobs to start are short ones.
ARMS=(dapo_resample dapo_resample+skip grpo avspo grpo+alloc grpo+alloc=0.5)

run_one() {  # <setting> <arm>: one sandbox invocation, its seeds one after another on one thread
    local setting=$1 arm=$2 extra
    read -r -a extra <<< "$SANDBOX_ARGS"
    [[ $setting == epochs ]] && extra+=(--train-set "$TRAIN_SET")
    mkdir -p "$OUT/$setting"
    "$VERL_AVSPO" sandbox --estimators "$arm" --seeds "$SEEDS" --seed-start "$SEED_START" --threads 1 \
        "${extra[@]}" --out "$OUT/$setting/$arm" > "$OUT/$setting/$arm.log" 2>&1
    echo "$setting $arm: done"
}
export -f run_one

started=$SECONDS
if [[ " $STAGES " == *" run "* ]]; then
    for arm in "${ARMS[@]}"; do printf '%s %s\n' default "$arm" epochs "$arm"; done \
        | xargs -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"'
    echo "run: $((SECONDS - started)) s"
fi
if [[ " $STAGES " == *" export "* ]]; then
    "$PYTHON" benchmarks/instrument_study_report.py export "$OUT" --csv "$CSV"
fi
if [[ " $STAGES " == *" report "* ]]; then
    "$PYTHON" benchmarks/instrument_study_report.py report "$CSV" --out "$PLOTS"
fi
echo "instrument_study: $((SECONDS - started)) s in all"
