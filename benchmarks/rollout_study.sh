#!/usr/bin/env bash
# The study of docs/results.md "Does AVSPO help, per step and per rollout": the pre-registered
# confirmation (easy mix, grpo vs avspo, seeds 100-119, benchmarks/paired_test.py) and the
# compute-normalised comparison (grpo, avspo, avspo:beta_loo, dapo_resample on both mixes,
# seeds 200-209, benchmarks/rollout_plots.py: tables at equal steps and equal rollouts, accuracy
# against cumulative rollouts). The two mixes of the comparison run as two processes at once.
# Writes $OUT/{confirm,compare/easy,compare/hard}/ and the plots under $PLOTS.
# The stages "skip" and "skip-report" run the pre-registered study of prompt skipping (docs/results.md
# "Skipping prompts predicted to collapse": grpo, grpo+skip, dapo_resample, avspo, avspo+skip on both
# mixes, seeds 300-309, at nice 5) into $OUT/skip/{easy,hard}/ and its tests and skip_*.png plots.
# Usage: bash benchmarks/rollout_study.sh        (about 30 min on 2 CPU cores, warm-ups included)
#        STAGES="compare report" bash benchmarks/rollout_study.sh   (skip the confirmation)
#        STAGES="skip skip-report" bash benchmarks/rollout_study.sh (the skipping study only)
set -euo pipefail
VERL_AVSPO=${VERL_AVSPO:-.venv/bin/verl-avspo}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/rollout_study}
PLOTS=${PLOTS:-docs/results}
STAGES=${STAGES:-confirm compare report}
# SANDBOX_ARGS adds options to every run, e.g. a smoke test of this script:
#   OUT=runs/smoke PLOTS=runs/smoke/plots CONFIRM_SEEDS=2 COMPARE_SEEDS=2 STEPS=4 \
#   SANDBOX_ARGS="--sft-steps 20 --eval-size 8 --eval-every 2" bash benchmarks/rollout_study.sh
STEPS=${STEPS:-60}
CONFIRM_SEEDS=${CONFIRM_SEEDS:-20}
COMPARE_SEEDS=${COMPARE_SEEDS:-10}
SKIP_SEEDS=${SKIP_SEEDS:-10}
read -r -a EXTRA <<< "${SANDBOX_ARGS:-}"
COMMON=(--steps "$STEPS" --threads 1 "${EXTRA[@]}")
EASY=1+1,2+1,1*1
HARD=2+2,2*1,3+2,1+1
started=$SECONDS
if [[ " $STAGES " == *" confirm "* ]]; then
    "$VERL_AVSPO" sandbox --estimators grpo,avspo --levels "$EASY" --seeds "$CONFIRM_SEEDS" --seed-start 100 "${COMMON[@]}" \
        --out "$OUT/confirm"
    echo "confirm: $((SECONDS - started)) s"
fi
if [[ " $STAGES " == *" compare "* ]]; then
    compare_started=$SECONDS
    mkdir -p "$OUT"
    for mix in "easy $EASY" "hard $HARD"; do
        set -- $mix
        "$VERL_AVSPO" sandbox --estimators grpo,avspo,avspo:beta_loo,dapo_resample --levels "$2" --seeds "$COMPARE_SEEDS" \
            --seed-start 200 "${COMMON[@]}" --out "$OUT/compare/$1" > "$OUT/compare-$1.log" 2>&1 &
    done
    wait
    echo "compare: $((SECONDS - compare_started)) s"
fi
if [[ " $STAGES " == *" skip "* ]]; then
    skip_started=$SECONDS
    mkdir -p "$OUT"
    for mix in "easy $EASY" "hard $HARD"; do
        set -- $mix
        nice -n 5 "$VERL_AVSPO" sandbox --estimators grpo,grpo+skip,dapo_resample,avspo,avspo+skip --levels "$2" \
            --seeds "$SKIP_SEEDS" --seed-start 300 "${COMMON[@]}" --out "$OUT/skip/$1" > "$OUT/skip-$1.log" 2>&1 &
    done
    wait
    echo "skip: $((SECONDS - skip_started)) s"
fi
if [[ " $STAGES " == *" report "* ]]; then
    "$PYTHON" benchmarks/paired_test.py "$OUT/confirm" --estimator avspo --baseline grpo --alpha 0.05
    "$PYTHON" benchmarks/rollout_plots.py "$OUT/compare" --out "$PLOTS"
fi
if [[ " $STAGES " == *" skip-report "* ]]; then
    "$PYTHON" benchmarks/rollout_plots.py "$OUT/skip" --out "$PLOTS" --prefix skip_ --pairs grpo+skip:grpo,avspo+skip:avspo \
        --late-from 40
fi
echo "rollout_study: $((SECONDS - started)) s in all"
