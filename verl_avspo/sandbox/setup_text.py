"""The setup paragraph of a sandbox comparison's ``summary.md``: what ran, in words, from the settings and
the estimators given (the task, the policy, the RL loop, what each estimator of the comparison does, where the
prompts come from and what the tables' columns mean)."""

from __future__ import annotations

from verl_avspo.sandbox.summary import first_steps_column
from verl_avspo.tools.stats import FINAL_EVALUATIONS

__all__ = ["setup_text"]


def _baselines_text(estimators) -> str:
    """What the paper's other baselines in this comparison do ("" if none is in it)."""
    labels = {spec.label for spec in estimators}
    sentences = {
        "dcpo": "`dcpo` standardizes each reward against its problem's rewards over all visits as well as its group "
        "(smooth advantage standardization) and clips the ratio with DCPO's token-wise bounds (dual clip at 10), "
        "through verl's registered `dcpo` estimator and policy loss.",
        "intuitor": "`intuitor` trains GRPO on the policy's self-certainty instead of the verifier's reward.",
        "rent": "`rent` trains GRPO on the negative mean token entropy instead of the verifier's reward.",
    }
    return "".join(f" {text}" for name, text in sentences.items() if name in labels)


def _warm_up_text(config) -> str:
    """The rate's warm-up ("" without one)."""
    ramp = config.lr_warmup_steps
    if not ramp:
        return ""
    return f" rising linearly from 0 over the first {ramp} steps" if ramp > 1 else " at 0 for the first step"


def _dapo_text(estimators) -> str:
    """What dapo does ("" if it is not in this comparison)."""
    if not any(spec.drop_collapsed and not spec.resample for spec in estimators):
        return ""
    return " `dapo` samples the same rollouts and drops collapsed groups from the loss (no re-sampling)."


def _resample_text(config, estimators) -> str:
    """What dapo_resample does ("" if it is not in this comparison)."""
    if not any(spec.resample for spec in estimators):
        return ""
    return (
        f" `dapo_resample` re-samples: it draws batches of {config.prompts_per_step} prompt groups until "
        f"{config.prompts_per_step} are not collapsed, at most {config.max_gen_batches} batches per step (verl's "
        "`max_num_gen_batches`), and trains on those, so it generates more rollouts per step than the others "
        "(`train/rollouts_generated`)."
    )


def _skip_text(config, estimators) -> str:
    """What +skip does ("" if no estimator of this comparison skips)."""
    if not any(spec.skip for spec in estimators):
        return ""
    return (
        " `+skip` adds the pre-rollout skip rule (GRESO's, default settings): it draws candidate batches of "
        f"{config.prompts_per_step} prompts and rolls out only those the rule keeps (a prompt whose last z visits "
        "collapsed is kept with probability p^z), until the step has its prompts (the last of "
        f"{config.max_gen_batches} draws keeps what is missing), so it generates as many rollouts as without it "
        "(the skipped prompts are re-selected, `prompts/reselected`); `dapo_resample+skip` leaves a batch's skipped "
        "places open, its next batch topping the step up (`prompts/rollouts_skipped`: the rollouts never generated)."
    )


def _alloc_text(config, estimators) -> str:
    """What +alloc does ("" if no estimator of this comparison allocates)."""
    if not any(spec.budget_share is not None for spec in estimators):
        return ""
    return (
        " `+alloc` gives each of the step's prompts the rollouts the per-prompt rollout allocator plans from its "
        f"history (default settings): a pilot of 2 for a prompt that collapsed on its last visit, G={config.group_size}"
        " for the others, up to 16 for those whose last pass rate lies within 1/4 of 1/2, within a budget of the "
        "given share (default 1) of a uniform step's rollouts; a pilot whose answers differ gets the rest of its "
        "group, a collapsed one is dropped (`prompts/pilots`, `prompts/pilots_extended`, `prompts/extra_rollouts`)."
    )


def _prompts_text(config) -> str:
    """Where the steps' prompts come from: the whole pools, or a fixed set in epochs (with how often an
    estimator that draws ``prompts_per_step`` prompts a step sees each)."""
    if config.train_set is None:
        return "Each step draws its prompts with replacement from the levels' training pools."
    draws = config.steps * config.prompts_per_step
    if draws < config.train_set:
        visits = f"only {draws} of its prompts seen, once each,"
    elif draws % config.train_set:
        visits = f"each prompt seen at least {draws // config.train_set} times"
    else:
        visits = f"each prompt seen {draws // config.train_set} times"
    return (
        f"Epochs mode: a fixed training set of {config.train_set} prompts per seed (evenly over the levels as far "
        f"as their pools go), drawn in epochs without replacement, {visits} by an estimator that draws "
        f"{config.prompts_per_step} prompts a step "
        f"({draws} draws; more by one that re-samples or skips). `prompts/always_solved` and `prompts/never_solved` "
        "are the shares of the set that were all-correct or all-wrong on every visit."
    )


def setup_text(config, estimators, seeds: range, first_steps: int) -> str:
    policy = config.policy
    uniform = config.prompts_per_step * config.group_size
    return (
        f"Task: synthetic arithmetic, levels {config.levels} (`1+1` adds two 1-digit numbers, `2*1` multiplies a "
        f"2-digit by a 1-digit number), exact-match reward in {{0, 1}}, {config.eval_size} held-out problems per "
        "level at most (a fifth of a small level).\n"
        f"Policy: random-init {policy.architecture} ({policy.num_layers} layers, hidden {policy.hidden_size}, "
        f"character tokenizer), warmed up by {policy.sft_steps} supervised steps (shared by every run).\n"
        f"RL: {config.steps} steps of {config.prompts_per_step} prompts x G={config.group_size} answers ({uniform} "
        "rollouts a step where every prompt gets one group of G; what each estimator generated, per step and in all, "
        f"is beside its accuracy below), temperature {config.temperature:g}, verl's `compute_advantage` "
        f"and `vanilla` PPO-clip loss (clip {config.clip_ratio}, {config.mini_batches} mini-batches, "
        f"`{config.loss_agg_mode}` aggregation), AdamW lr {config.lr}{_warm_up_text(config)}; seeds "
        f"{seeds[0]}..{seeds[-1]} (same seed: same prompts for every estimator).{_dapo_text(estimators)}"
        f"{_resample_text(config, estimators)}"
        f"{_skip_text(config, estimators)}{_alloc_text(config, estimators)}"
        f"{_baselines_text(estimators)} {_prompts_text(config)}\n"
        f"Estimators: {', '.join(f'`{s.label}`' for s in estimators)}. ACR (raw) is measured on the rewards before "
        "any estimator; effective ACR is the fraction of groups whose final advantages are all zero (for GRPO it "
        "equals the raw ACR, so its two lines in `acr.png` coincide). "
        f"'{first_steps_column(first_steps)}' is the early-training ACR the paper found predictive of final accuracy.\n"
        f"Accuracy, mean@k and pass@k are final: the mean of a run's last {FINAL_EVALUATIONS} evaluations (for *no "
        "training*, the warmed-up policy's step-0 evaluation, held: what a run that never trains would report, at 0 "
        "rollouts); ± is the standard deviation over seeds."
    )
