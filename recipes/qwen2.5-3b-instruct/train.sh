#!/usr/bin/env bash
# Qwen/Qwen2.5-3B-Instruct: instruct model (the paper reports +4-6 points average and ACR 0.28-0.45 -> 0.11-0.18 across models)
# Hardware (estimate, see recipes/README.md): 2 GPUs with 80 GB.
#
#   bash recipes/qwen2.5-3b-instruct/train.sh                      # AVSPO, the paper's method
#   ESTIMATOR=grpo bash recipes/qwen2.5-3b-instruct/train.sh       # or drgrpo | dapo | paper_code | dcpo | rent | intuitor
#   DRY_RUN=1 bash recipes/qwen2.5-3b-instruct/train.sh            # check the config offline, print the command
#   MODE=eval bash recipes/qwen2.5-3b-instruct/train.sh            # final evaluation of the merged checkpoint
#   bash recipes/qwen2.5-3b-instruct/train.sh trainer.test_freq=5  # extra arguments go to verl

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
MODEL_TAG=qwen2.5-3b-instruct
N_GPUS=${N_GPUS:-2}
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.5}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-16384}
OPTIMIZER_OFFLOAD=${OPTIMIZER_OFFLOAD:-False}

source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
