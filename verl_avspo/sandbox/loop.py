"""The sandbox RL loop: one readable function, CleanRL style, built from verl's own pieces.

Each step samples ``group_size`` answers for each of ``prompts_per_step`` prompts at
``config.temperature``, scores them with the exact-match verifier, computes advantages with verl's
``ray_trainer.compute_advantage`` on a ``DataProto`` (so any registered estimator, ``avspo``
included, is selected by name), and takes PPO-clip steps with verl's ``vanilla`` policy loss (or ``dcpo``) and
AdamW. Metrics are written in verl's file-logger JSONL format under the same names as the verl
integration (``acr/rate``, ``acr/effective``, ``avspo/threshold``, ...), plus ``actor/entropy``:
the token-mean entropy of the sampling policy over the step's responses.

``intuitor`` and ``rent`` train on an intrinsic reward from the same logits (self-certainty,
negative entropy); ``acr/*`` is then measured on that reward, and ``train/reward_mean`` stays
the verifier's. ``dcpo`` is verl's ``dcpo`` estimator (prompt keys: the problem's text) and
``dcpo`` policy loss as this package registers them.

``dapo_resample`` draws more batches of prompt groups each step
(:func:`~verl_avspo.sandbox.sampling.dynamic_sampling`, verl's
``algorithm.filter_groups`` with ``max_num_gen_batches``) until its batch is full of groups whose
rewards differ; its ``acr/rate`` is over every group it drew, its ``acr/effective`` over the groups
it trained on. Every run logs the rollouts it generated per step (``train/rollouts_generated``, in
``train/gen_batches`` batches) and since the start (``train/rollouts_cumulative``, on the evaluation
records too), counted by the run tracker as on every host, so that runs can be compared at equal
rollouts. With the skip rule, ``dapo_resample`` leaves a skipped prompt's place open in its batch
(DAPO's next batch tops up only if needed): its rollouts are saved (``prompts/rollouts_skipped``).
With the rollout allocator (``+alloc``) the groups differ in size (a pilot extended to G, G, or more);
its collapsed pilots are dropped before the advantages and count, as DAPO's discarded groups do, in the
step's ACR and the prompt history. The update's mini-batches are of whole groups, whatever their sizes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm.auto import tqdm
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.torch_functional import get_constant_schedule_with_warmup, masked_mean
from verl.workers.config.actor import ActorConfig

from verl_avspo.core.collapse import DroppedGroups, group_stats
from verl_avspo.core.intrinsic import negative_entropy, self_certainty, token_entropy
from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.estimators import EstimatorSpec
from verl_avspo.sandbox.policy import (
    CharTokenizer,
    pad_cat,
    response_log_probs,
    sample,
    token_log_probs,
    warm_policy,
)
from verl_avspo.sandbox.sampling import (
    SampledGroups,
    TrainingEpochs,
    allocated_groups,
    collapsed_groups,
    dynamic_sampling,
    group_sizes,
    sample_groups,
)
from verl_avspo.sandbox.task import ArithmeticTask, exact_match, parse_levels
from verl_avspo.tools.logs import write_record
from verl_avspo.verl_plugin import register, run_state

__all__ = ["train", "evaluate"]

# The token stream's seed is the run's seed plus this, so that it is not the prompt stream's
# (torch's generator keeps 32 bits of a seed).
TOKEN_SEED_OFFSET = 104_729


def _token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(n,) outcome scores -> (n, R) token rewards on each response's last token, as verl's reward
    managers place them."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(dim=1) - 1).clamp(min=0)
    return rewards.index_put_((torch.arange(len(scores)), last), scores.float())


def _token_mean_entropy(parts: list[SampledGroups]) -> float:
    """Token-mean entropy of the sampling policy over every response of ``parts``."""
    entropy = pad_cat([token_entropy(part.logits) for part in parts], 0.0)
    return masked_mean(entropy, pad_cat([part.rollout.response_mask.float() for part in parts], 0.0)).item()


def _others(pick: torch.Tensor, part: SampledGroups) -> torch.Tensor:
    """(P,) bool: the groups of ``part`` not in ``pick``."""
    others = torch.ones(len(part.prompts), dtype=torch.bool)
    others[pick] = False
    return others


def _share_among_identical(rewards: torch.Tensor, rollout) -> torch.Tensor:
    """(n,) rewards with every identical (prompt, response) pair given their mean.

    A guard: batched forward passes may differ in the last bits between rows (several threads, a
    GPU), and GRPO divides by (std + 1e-6), which would turn ~1e-7 of noise between identical
    answers into advantages of order 0.1. With one CPU thread the rows came out bit-identical
    (the default comparison gave the same numbers with and without it).
    """
    rows = torch.cat([rollout.prompt_ids, rollout.response_ids * rollout.response_mask], dim=1)
    _, same = torch.unique(rows, dim=0, return_inverse=True)
    return group_stats(rewards, same, int(same.max()) + 1).mean[same].to(rewards.dtype)


@torch.no_grad()
def evaluate(model, tokenizer: CharTokenizer, task: ArithmeticTask, pass_k: int, seed: int) -> dict[str, float]:
    """Greedy accuracy, pass@k (k samples at temperature 1.0, any correct) and mean@k (the share of
    those k samples that are correct: sampled accuracy) per level on the held-out sets. Draws from its
    own generator, seeded by ``seed`` at every evaluation, so that evaluating never shifts the training
    samples."""
    metrics = {}
    max_new_tokens = task.max_answer_chars + 1
    generator = torch.Generator().manual_seed(seed)
    for index in range(len(task.levels)):
        problems = task.eval_set(index)
        greedy = sample(model, tokenizer, problems.prompts, max_new_tokens, generator=None)
        correct = exact_match(tokenizer.decode_responses(greedy.response_ids, greedy.response_mask), problems.answers)
        sampled = sample(model, tokenizer, problems.prompts * pass_k, max_new_tokens, generator)
        texts = tokenizer.decode_responses(sampled.response_ids, sampled.response_mask)
        hits = exact_match(texts, problems.answers * pass_k).view(pass_k, -1)
        metrics[f"eval/acc_level_{index + 1}"] = correct.mean().item()
        metrics[f"eval/pass@{pass_k}_level_{index + 1}"] = hits.amax(dim=0).mean().item()
        metrics[f"eval/mean@{pass_k}_level_{index + 1}"] = hits.mean().item()
    for name in ("acc", f"mean@{pass_k}"):
        metrics[f"eval/{name}_mean"] = float(
            np.mean([metrics[f"eval/{name}_level_{i + 1}"] for i in range(len(task.levels))])
        )
    return metrics


def train(
    config: SandboxConfig,
    estimator: EstimatorSpec,
    seed: int,
    log_path: Path,
    cache_dir: Path | None = None,
    on_rollout: Callable[[int, transformers.PreTrainedModel, SampledGroups], None] | None = None,
) -> None:
    """One RL run of ``config.steps`` steps; writes its metrics to ``log_path`` (JSONL).
    ``on_rollout(step, model, batch)`` sees each step's training batch before the update (the
    fingerprint hashes it)."""
    task = ArithmeticTask(parse_levels(config.levels), config.eval_size, config.warm_up_share)
    model, tokenizer = warm_policy(config.policy, task, cache_dir)
    # The run's random streams, independent of the warm-up (built or loaded from the cache) and of
    # torch's global generator: the prompts and the update order, and the sampled tokens.
    prompt_rng = torch.Generator().manual_seed(seed)
    token_rng = torch.Generator().manual_seed(seed + TOKEN_SEED_OFFSET)
    # The steps' prompts: the levels' whole pools, or a fixed set in epochs (config.train_set).
    source = task if config.train_set is None else TrainingEpochs(task, config.train_set, prompt_rng)
    register.register()  # the estimators this loop selects by name (a test may have cleared verl's registry)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    # Stepped once per RL step, as verl's actor steps its scheduler once per update_policy.
    lr_schedule = get_constant_schedule_with_warmup(optimizer, config.lr_warmup_steps)
    algorithm = estimator.algorithm_config(seed)
    # The run's one owner of each step's ACR, alert and state (AVSPO's controller, DCPO's history).
    tracker = run_state.start_run(algorithm)
    tracker.set_prompt_skip(estimator.prompt_skip(seed))
    tracker.set_prompt_allocation(estimator.prompt_allocation(seed, config.group_size))
    skip_rule = None
    if estimator.skip:

        def skip_rule(prompts: list[str], at_least: int, refill: bool) -> np.ndarray:
            return tracker.select_prompts(prompts, config.group_size, at_least, refill)

    policy_loss = core_algos.get_policy_loss_fn("dcpo" if estimator.dcpo else "vanilla")
    actor = ActorConfig(
        strategy="fsdp",  # a label here; verl's loss reads only the clip ratios and global_batch_info
        rollout_n=config.group_size,
        ppo_micro_batch_size_per_gpu=config.prompts_per_step * config.group_size // config.mini_batches,
        clip_ratio=config.clip_ratio,
        clip_ratio_low=config.clip_ratio,
        clip_ratio_high=config.clip_ratio,
        # verl's dual clip of negative advantages (and, for DCPO, the cap of its upper bound):
        # verl's default 3, DCPO's released 10.
        clip_ratio_c=10.0 if estimator.dcpo else 3.0,
        loss_agg_mode=config.loss_agg_mode,
        use_torch_compile=False,
    )

    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A stream, not core.files.atomic_write: the log is appended step by step so that a run stopped
    # midway keeps (and `verl-avspo report` reads) the steps it trained; a torn last line is skipped
    # with a warning by tools.logs, as in verl's own logs.
    with log_path.open("w") as log:
        model.eval()
        write_record(log, 0, {**evaluate(model, tokenizer, task, config.pass_k, seed), "train/rollouts_cumulative": 0})
        progress = tqdm(range(1, config.steps + 1), desc=f"{estimator.label} seed {seed}", unit="step")
        for step in progress:
            # 1. Rollout: G answers per prompt; the responses of one prompt share a uid. Groups generated but
            # not trained on (dapo_resample's discarded ones, the allocator's collapsed pilots) are kept aside.
            dropped_prompts, dropped_scores = [], None
            if estimator.resample:
                # DAPO tops the step up with further batches: a skipped prompt's place is left open (fill=1).
                drawn, picks = dynamic_sampling(
                    lambda b, step=step: sample_groups(
                        model, tokenizer, source, config, (prompt_rng, token_rng), f"{step}-{b}", skip_rule, fill=1
                    ),
                    config.group_size,
                    config.prompts_per_step,
                    config.max_gen_batches,
                )
                batch = SampledGroups.concat(
                    [part.select_groups(pick) for part, pick in zip(drawn, picks, strict=True)], tokenizer.pad_id
                )
                others = [_others(pick, part) for part, pick in zip(drawn, picks, strict=True)]
                dropped_prompts = [
                    p
                    for part, o in zip(drawn, others, strict=True)
                    for p, out in zip(part.prompts, o.tolist(), strict=True)
                    if out
                ]
                dropped_scores = torch.cat(
                    [part.scores.view(-1, config.group_size)[o] for part, o in zip(drawn, others, strict=True)]
                )
            elif estimator.budget_share is not None:
                # The allocator's pilots, full and larger groups; collapsed pilots are dropped.
                drawn, batch, dropped_prompts, dropped_scores = allocated_groups(
                    model, tokenizer, source, config, (prompt_rng, token_rng), f"{step}", tracker
                )
            else:
                drawn = [sample_groups(model, tokenizer, source, config, (prompt_rng, token_rng), f"{step}", skip_rule)]
                batch = drawn[0]
            if on_rollout is not None:
                on_rollout(step, model, batch)
            rollout, scores, uids = batch.rollout, batch.scores, batch.uids
            num_groups = len(batch.prompts)
            sizes = group_sizes(uids)  # (num_groups,) rows per group, in batch order
            starts = torch.cumsum(sizes, 0) - sizes
            # The sampling policy's logits give PPO's old log-probs, the entropy and intrinsic rewards.
            with torch.no_grad():
                old_log_probs = token_log_probs(batch.logits, rollout.response_ids)
                entropy = token_entropy(batch.logits)
                response_mask = rollout.response_mask.float()
                if estimator.reward == "self_certainty":
                    rewards = self_certainty(batch.logits, response_mask)
                elif estimator.reward == "negative_entropy":
                    rewards = negative_entropy(entropy, response_mask)
                else:
                    rewards = scores
            if estimator.intrinsic:
                rewards = _share_among_identical(rewards, rollout)

            # 2. The step's raw collapse, measured once on the rewards the estimator sees (for
            # dapo_resample, the groups it discarded count too, in the prompt history as well); then
            # advantages through verl's dispatch. A prompt's identity (DCPO's and the prompt history's
            # key) is the problem's text.
            dropped = None
            if dropped_scores is not None:
                dropped = DroppedGroups.of(dropped_scores, tracker.acr.tau)
                tracker.record_groups(dropped_prompts, dropped_scores)
            tracker.count_rollouts(sum(len(part.scores) for part in drawn), len(drawn))
            tracker.measure(rewards, uids, dropped)
            tracker.set_prompt_keys(dict(zip(uids[starts.numpy()], batch.prompts, strict=True)))
            advantages = torch.zeros_like(response_mask)
            if num_groups:  # dapo_resample may end a step at its cap with no group to train on
                data = DataProto.from_dict(
                    tensors={
                        "token_level_rewards": _token_rewards(rewards, rollout.response_mask),
                        "response_mask": response_mask,
                    },
                    non_tensors={"uid": uids},
                )
                # The estimator uses this run's tracker, the one start_run served for algorithm.
                advantages = compute_advantage(data, algorithm.adv_estimator, config=algorithm).batch["advantages"]
            metrics = tracker.end_step(step, advantages)

            # 3. PPO-clip update on the kept responses, in mini-batches of whole groups.
            model.train()
            # Shuffle all groups, then keep: every estimator draws the same from prompt_rng, so
            # runs with the same seed see the same prompts (dapo too) and stay paired by seed;
            # dapo_resample draws more prompts, so it shares only its first batch.
            groups = torch.randperm(num_groups, generator=prompt_rng)
            if estimator.drop_collapsed and num_groups:  # dapo: groups of G
                groups = groups[~collapsed_groups(scores, config.group_size)[groups]]
            losses, clipfracs = [], []
            # No mini-batch when dapo dropped every group: the step makes no update.
            for chunk in groups.chunk(config.mini_batches) if groups.numel() else ():
                # The chunk's groups' rows, group after group: starts[g] .. starts[g] + sizes[g] - 1.
                lengths = sizes[chunk]
                offsets = starts[chunk] - (torch.cumsum(lengths, 0) - lengths)
                rows = torch.repeat_interleave(offsets, lengths) + torch.arange(int(lengths.sum()))
                part = rollout.select(rows)
                loss, pg_metrics = policy_loss(
                    old_log_prob=old_log_probs[rows],
                    log_prob=response_log_probs(model, part, config.temperature),
                    advantages=advantages[rows],
                    response_mask=part.response_mask.float(),
                    loss_agg_mode=actor.loss_agg_mode,
                    config=actor,
                )
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                losses.append(loss.item())
                clipfracs.append(pg_metrics["actor/pg_clipfrac"])
            metrics["actor/lr"] = lr_schedule.get_last_lr()[0]  # the rate this step's update used, as verl logs it
            with warnings.catch_warnings():  # a step with no update (dapo kept nothing) still counts, as in verl
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
                lr_schedule.step()

            metrics.update(
                {
                    "train/reward_mean": torch.cat([d.scores for d in drawn]).mean().item(),
                    "actor/entropy": _token_mean_entropy(drawn),
                    **(
                        {"train/resample_capped": float(num_groups < config.prompts_per_step)}
                        if estimator.resample
                        else {}
                    ),
                    **({"train/intrinsic_reward_mean": rewards.mean().item()} if estimator.intrinsic else {}),
                    "train/kept_groups": groups.numel() / config.prompts_per_step,
                    "actor/pg_loss": float(np.mean(losses)) if losses else 0.0,
                    "actor/pg_clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
                }
            )
            if step % config.eval_every == 0 or step == config.steps:
                model.eval()
                metrics.update(evaluate(model, tokenizer, task, config.pass_k, seed))
            write_record(log, step, metrics)
            progress.set_postfix({"acr": f"{metrics['acr/rate']:.2f}", "reward": f"{metrics['train/reward_mean']:.2f}"})
