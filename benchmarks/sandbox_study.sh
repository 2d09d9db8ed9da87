#!/usr/bin/env bash
# The sandbox study of docs/results.md: every estimator, 5 seeds, a mostly-easy and a mostly-hard
# mix of levels, all else at the sandbox defaults (60 steps x 16 prompts x G=8). Each mix writes
# summary.md, acr.png, accuracy.png and the per-step JSONL under $OUT/<mix>/.
# Usage: bash benchmarks/sandbox_study.sh            (about 20 min on 2 CPU cores, warm-ups included)
set -euo pipefail
VERL_AVSPO=${VERL_AVSPO:-.venv/bin/verl-avspo}
OUT=${OUT:-runs/study}
SEEDS=${SEEDS:-5}
STEPS=${STEPS:-60}
ESTIMATORS=${ESTIMATORS:-grpo,dapo,avspo,avspo:paper_code,avspo:beta_loo,avspo:beta_fitted,dcpo,intuitor,rent}
# easy: about 55% of groups collapse, nearly all of them all-correct;
# hard: about 65% collapse, mostly all-wrong (measured with grpo).
for mix in "easy 1+1,2+1,1*1" "hard 2+2,2*1,3+2,1+1"; do
    set -- $mix
    "$VERL_AVSPO" sandbox --estimators "$ESTIMATORS" --levels "$2" --steps "$STEPS" --seeds "$SEEDS" \
        --threads 1 --out "$OUT/$1"
done
