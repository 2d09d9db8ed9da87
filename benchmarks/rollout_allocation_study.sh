#!/usr/bin/env bash
# The pre-registered study of docs/results.md "Rollouts per prompt from the history (pre-registered)":
# grpo, dapo_resample, grpo+alloc and grpo+alloc=0.5 in the sandbox's epochs mode, both mixes, fresh seeds
# 500-509, through the first rollouts study's script (benchmarks/rollouts_saved_study.sh: its stages "run"
# and "report", the same settings otherwise). Writes runs/rollout_allocation/, the per-seed CSV
# docs/results/rollout_allocation.csv and the rollout_allocation_*.png plots.
# Usage: bash benchmarks/rollout_allocation_study.sh
#        STAGES=report bash benchmarks/rollout_allocation_study.sh   (the tables and plots again)
set -euo pipefail
export ARMS=grpo,dapo_resample,grpo+alloc,grpo+alloc=0.5
export SEED_START=${SEED_START:-500}
export GAINS=${GAINS:-easy=1,hard=1}
export PAIRS=grpo+alloc:grpo,grpo+alloc=0.5:grpo
export BASELINES=grpo,dapo_resample
export PREFIX=rollout_allocation_
export OUT=${OUT:-runs/rollout_allocation}
export CSV=${CSV:-docs/results/rollout_allocation.csv}
exec bash "$(dirname "$0")/rollouts_saved_study.sh"
