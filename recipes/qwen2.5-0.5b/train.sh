#!/usr/bin/env bash
# Qwen/Qwen2.5-0.5B: the smallest model of the paper's sweep (it reports +4-6 points average over GRPO across models)
# Hardware (estimate, see recipes/README.md): 1 GPU with 40 GB or more.
#
#   bash recipes/qwen2.5-0.5b/train.sh                      # AVSPO, the paper's method
#   ESTIMATOR=grpo bash recipes/qwen2.5-0.5b/train.sh       # or drgrpo | dapo | paper_code | dcpo | rent | intuitor
#   DRY_RUN=1 bash recipes/qwen2.5-0.5b/train.sh            # check the config offline, print the command
#   MODE=eval bash recipes/qwen2.5-0.5b/train.sh            # final evaluation of the merged checkpoint
#   bash recipes/qwen2.5-0.5b/train.sh trainer.test_freq=5  # extra arguments go to verl

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B}
MODEL_TAG=qwen2.5-0.5b
N_GPUS=${N_GPUS:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.4}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-16384}
OPTIMIZER_OFFLOAD=${OPTIMIZER_OFFLOAD:-False}

source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
