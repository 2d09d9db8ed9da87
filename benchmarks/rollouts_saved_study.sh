#!/usr/bin/env bash
# The pre-registered study of docs/results.md "Rollouts saved by skipping (pre-registered)": grpo,
# grpo+skip, dapo_resample and dapo_resample+skip in the sandbox's epochs mode (--train-set), both
# mixes, fresh seeds 400-409, the two mixes as two processes at once (stage "run"); then the per-seed
# CSV beside the page and every table and plot recomputed from it (stage "report",
# benchmarks/rollouts_saved_report.py).
# Writes $OUT/{easy,hard}/, $CSV and the rollouts_saved_*.png plots under $PLOTS.
# benchmarks/rollout_allocation_study.sh runs the second study through this script (ARMS, SEED_START, GAINS,
# PAIRS, BASELINES, PREFIX, OUT and CSV set there).
# Usage: bash benchmarks/rollouts_saved_study.sh                 (both stages)
#        STAGES=report bash benchmarks/rollouts_saved_study.sh   (the tables and plots again, from the runs)
# A smoke test of this script with tiny settings (about 4 min on the loaded 2-core machine):
#   OUT=runs/smoke CSV=runs/smoke/rollouts_saved.csv PLOTS=runs/smoke/plots SEEDS=1 STEPS=5 TRAIN_SET=16 \
#   SANDBOX_ARGS="--sft-steps 20 --eval-size 8 --eval-every 1" bash benchmarks/rollouts_saved_study.sh
set -euo pipefail
VERL_AVSPO=${VERL_AVSPO:-.venv/bin/verl-avspo}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/rollouts_saved}
CSV=${CSV:-docs/results/rollouts_saved.csv}
PLOTS=${PLOTS:-docs/results}
STAGES=${STAGES:-run report}
STEPS=${STEPS:-60}
SEEDS=${SEEDS:-10}
SEED_START=${SEED_START:-400}
TRAIN_SET=${TRAIN_SET:-128}
ARMS=${ARMS:-grpo,grpo+skip,dapo_resample,dapo_resample+skip}
PREFIX=${PREFIX:-rollouts_saved_}
GAINS=${GAINS:-easy=8,hard=1}
PAIRS=${PAIRS:-dapo_resample+skip:dapo_resample}
BASELINES=${BASELINES:-grpo}
read -r -a EXTRA <<< "${SANDBOX_ARGS:-}"
COMMON=(--estimators "$ARMS" --steps "$STEPS" --train-set "$TRAIN_SET" --seeds "$SEEDS" --seed-start "$SEED_START"
        --threads 1 "${EXTRA[@]}")
EASY=1+1,2+1,1*1
HARD=2+2,2*1,3+2,1+1
started=$SECONDS
if [[ " $STAGES " == *" run "* ]]; then
    mkdir -p "$OUT"
    for mix in "easy $EASY" "hard $HARD"; do
        set -- $mix
        "$VERL_AVSPO" sandbox --levels "$2" "${COMMON[@]}" --out "$OUT/$1" > "$OUT/$1.log" 2>&1 &
    done
    wait
    echo "run: $((SECONDS - started)) s"
fi
if [[ " $STAGES " == *" report "* ]]; then
    "$PYTHON" benchmarks/rollouts_saved_report.py export "$OUT" --csv "$CSV" --gain "$GAINS"
    "$PYTHON" benchmarks/rollouts_saved_report.py report "$CSV" --out "$PLOTS" --prefix "$PREFIX" --pairs "$PAIRS" \
        --baselines "$BASELINES"
fi
echo "rollouts_saved_study: $((SECONDS - started)) s in all"
