# Shared settings of every recipe (the paper's setup, docs/method.md §7), sourced by recipes/<model>/train.sh.
#
# A model script sets what differs per model (MODEL_PATH, MODEL_TAG, N_GPUS, ROLLOUT_TP, ...),
# then sources this file, which builds the verl command and runs it. Every variable below can be
# set in the environment; arguments given to the model script are passed on to verl last, so they
# override anything here (Hydra keeps the last value of a key).
#
#   ESTIMATOR  avspo (default) | grpo | drgrpo | dapo | paper_code | dcpo | rent | intuitor
#   MODE       train (default) | eval (the final checkpoint, 2048 tokens, all benchmarks)
#   DRY_RUN=1  (or true/yes) check the config, data files, model path and GPUs without starting
#              anything (no Ray, no model), print the command, exit
#   TAG        suffix of the run name, for ablations: TAG=k1 bash ... algorithm.avspo.k=1

set -euo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$RECIPES_DIR")

: "${MODEL_PATH:?the model script must set MODEL_PATH}"
: "${MODEL_TAG:?the model script must set MODEL_TAG}"

ESTIMATOR=${ESTIMATOR:-avspo}
MODE=${MODE:-train}
DRY_RUN=${DRY_RUN:-0}
case "${DRY_RUN,,}" in
    1|true|yes|on) DRY_RUN=1 ;;
    0|false|no|off|"") DRY_RUN=0 ;;
    *)
        echo "DRY_RUN=$DRY_RUN is not understood; use DRY_RUN=1 (or true, yes) for a dry run, or DRY_RUN=0 (or leave it unset) to train" >&2
        exit 2 ;;
esac
# Unquoted on purpose where it is used, so that PYTHON="uv run python" works.
PYTHON=${PYTHON:-python3}

# The paper's training settings.
GROUP_SIZE=${GROUP_SIZE:-8}
TEMPERATURE=${TEMPERATURE:-1.0}
LR=${LR:-1e-6}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-1}
# Our batch (the paper's TRL run used 1 prompt per step): 8 prompts x 8 answers, one optimizer
# step per batch, so 500 problems give 62 steps.
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-8}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-$TRAIN_BATCH_SIZE}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-20}

# Hardware, set per model.
N_GPUS=${N_GPUS:-1}
NNODES=${NNODES:-1}
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.5}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-16384}
PARAM_OFFLOAD=${PARAM_OFFLOAD:-False}
OPTIMIZER_OFFLOAD=${OPTIMIZER_OFFLOAD:-False}

# Data (recipes/data writes these) and results.
DATA_DIR=${DATA_DIR:-$REPO_DIR/data}
TRAIN_FILE=${TRAIN_FILE:-$DATA_DIR/math/train_level3_$MODEL_TAG.parquet}
VAL_SETS=${VAL_SETS:-math500 gsm8k minerva_math olympiadbench amc23 aime2024}
RUNS_DIR=${RUNS_DIR:-$REPO_DIR/runs}
RUN_NAME=${RUN_NAME:-${MODEL_TAG}_${ESTIMATOR}${TAG:+_$TAG}}
RUN_DIR=$RUNS_DIR/$RUN_NAME

case "$ESTIMATOR" in
    avspo) ALGORITHM=(algorithm.adv_estimator=avspo algorithm.avspo.preset=paper) ;;
    paper_code) ALGORITHM=(algorithm.adv_estimator=avspo algorithm.avspo.preset=paper_code) ;;
    grpo) ALGORITHM=(algorithm.adv_estimator=grpo) ;;
    # Dr. GRPO as verl documents it: no std division, and a constant-length loss normaliser.
    drgrpo)
        ALGORITHM=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False
            actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm) ;;
    # DAPO's dynamic sampling in verl's V1 trainer: drop groups whose rewards are all equal and
    # keep sampling prompts until a full batch has signal (clip-higher etc. are not part of it).
    dapo)
        ALGORITHM=(algorithm.adv_estimator=grpo algorithm.filter_groups.enable=True
            algorithm.filter_groups.metric=reward) ;;
    # DCPO: smooth advantage standardization over each prompt's reward history (keyed by the
    # data's extra_info.index) and dynamic-adaptive clipping, capped and dual-clipped at 10 as in
    # the authors' code.
    dcpo)
        ALGORITHM=(algorithm.adv_estimator=dcpo actor_rollout_ref.actor.policy_loss.loss_mode=dcpo
            actor_rollout_ref.actor.clip_ratio_c=10) ;;
    # RENT: GRPO on the negative mean token entropy of each response (no verifier in training).
    rent) ALGORITHM=(algorithm.adv_estimator=grpo algorithm.intrinsic.reward=negative_entropy) ;;
    # INTUITOR: GRPO on self-certainty. Needs patches/verl-0.9.1-intrinsic.patch applied to verl;
    # the launcher refuses it on an unpatched verl.
    intuitor) ALGORITHM=(algorithm.adv_estimator=grpo algorithm.intrinsic.reward=self_certainty) ;;
    *)
        echo "ESTIMATOR=$ESTIMATOR is not a recipe estimator; use one of: avspo grpo drgrpo dapo paper_code dcpo rent intuitor" >&2
        exit 2 ;;
esac

case "$MODE" in
    train)
        LOG_FILE=$RUN_DIR/metrics.jsonl
        MODEL_OVERRIDES=(actor_rollout_ref.model.path="$MODEL_PATH")
        EVAL_OVERRIDES=() ;;
    # The paper evaluates with 2048 new tokens; verl validates with the training response length,
    # so the final evaluation is a separate validation-only run on the merged checkpoint.
    eval)
        LOG_FILE=$RUN_DIR/eval.jsonl
        VAL_SETS=${EVAL_SETS:-$VAL_SETS mmlu_pro}
        MAX_RESPONSE_LENGTH=${EVAL_RESPONSE_LENGTH:-2048}
        MODEL_OVERRIDES=(actor_rollout_ref.model.path="${EVAL_MODEL:-$RUN_DIR/hf}")
        # resume_mode=disable: evaluate EVAL_MODEL itself, never a checkpoint found in the run dir.
        EVAL_OVERRIDES=(trainer.val_only=True trainer.val_before_train=True trainer.resume_mode=disable) ;;
    *)
        echo "MODE=$MODE is not a recipe mode; use train or eval" >&2
        exit 2 ;;
esac

VAL_FILES=""
for name in $VAL_SETS; do
    VAL_FILES+="${VAL_FILES:+,}'$DATA_DIR/eval/$name.parquet'"
done

OVERRIDES=(
    "${ALGORITHM[@]}"
    algorithm.use_kl_in_reward=False
    data.train_files="$TRAIN_FILE"
    data.val_files="[$VAL_FILES]"
    data.train_batch_size="$TRAIN_BATCH_SIZE"
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.filter_overlong_prompts=True
    data.truncation=error
    "${MODEL_OVERRIDES[@]}"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.optim.lr="$LR"
    actor_rollout_ref.actor.optim.weight_decay=0.01
    actor_rollout_ref.actor.optim.clip_grad=1.0
    # verl's policy loss reads clip_ratio_low/high (each its own 0.2 default), not clip_ratio.
    actor_rollout_ref.actor.clip_ratio=0.2
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.2
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.kl_loss_coef=0.0
    actor_rollout_ref.actor.entropy_coeff=0.0
    actor_rollout_ref.actor.fsdp_config.param_offload="$PARAM_OFFLOAD"
    actor_rollout_ref.actor.fsdp_config.optimizer_offload="$OPTIMIZER_OFFLOAD"
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n="$GROUP_SIZE"
    actor_rollout_ref.rollout.temperature="$TEMPERATURE"
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP"
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION"
    actor_rollout_ref.rollout.val_kwargs.do_sample=False
    actor_rollout_ref.rollout.val_kwargs.temperature=0
    actor_rollout_ref.rollout.val_kwargs.n=1
    reward.custom_reward_function.path=pkg://verl_avspo.verl_plugin.rewards
    reward.custom_reward_function.name=compute_score
    trainer.logger='["console","file"]'
    trainer.project_name=verl-avspo
    trainer.experiment_name="$RUN_NAME"
    trainer.default_local_dir="$RUN_DIR/checkpoints"
    trainer.validation_data_dir="$RUN_DIR/validation"
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes="$NNODES"
    trainer.total_epochs="$TOTAL_EPOCHS"
    trainer.test_freq="$TEST_FREQ"
    trainer.save_freq="$SAVE_FREQ"
    trainer.val_before_train=True
    "${EVAL_OVERRIDES[@]}"
)

# verl's file logger writes here; the trainer runs in a Ray actor, so the path is absolute.
export VERL_FILE_LOGGER_PATH=$LOG_FILE

LAUNCHER=($PYTHON -m verl_avspo.main_ppo)
if [[ "$DRY_RUN" == 1 ]]; then
    printf 'VERL_FILE_LOGGER_PATH=%q' "$VERL_FILE_LOGGER_PATH"
    printf ' %q' "${LAUNCHER[@]}" "${OVERRIDES[@]}" "$@"
    printf '\n'
    exec "${LAUNCHER[@]}" --dry-run "${OVERRIDES[@]}" "$@"
fi
mkdir -p "$RUN_DIR"
exec "${LAUNCHER[@]}" "${OVERRIDES[@]}" "$@"
