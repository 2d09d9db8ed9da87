"""``verl-avspo sandbox``: a small, real RLVR comparison on CPU.

A tiny random-init causal LM, warmed up on synthetic arithmetic to a partial skill, is trained
with each estimator for each seed; every run writes verl-format metrics JSONL, and the command
writes ``summary.md`` and PNG curves of ACR and accuracy. See ``verl_avspo.sandbox.loop``.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace
from pathlib import Path

from verl_avspo.core.files import FileWriteError, check_folder, write_text

__all__ = ["configure", "run"]

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    from verl_avspo.sandbox.kernels import pin_kernels

    pin_kernels()  # before the first import of torch (sandbox.config imports it): torch reads them as it loads
    from verl_avspo.sandbox.config import SandboxConfig
    from verl_avspo.sandbox.estimators import SUPPORTED

    defaults = SandboxConfig()
    parser.add_argument(
        "--estimators",
        default="grpo,avspo,avspo:paper_code",
        help=f"comma-separated estimators: {', '.join(SUPPORTED)}; avspo:<preset> picks an AVSPO preset; dapo is "
        "grpo that drops collapsed groups from the loss at the same rollouts, without re-sampling; dapo_resample is "
        "DAPO's dynamic sampling (more prompt groups each step until the batch is full of non-collapsed ones, capped "
        "by --max-gen-batches); <estimator>+skip adds the pre-rollout skip rule (GRESO's: prompts that collapsed on "
        "their recent visits are skipped with a probability, docs/prompts.md); <estimator>+alloc (or +alloc=<budget "
        "share>) gives each prompt the rollouts its history calls for: a pilot of 2, the group, or more; dcpo, "
        "intuitor and rent are the paper's other baselines (default: grpo,avspo,avspo:paper_code; the paper's whole "
        "table: grpo,avspo,dcpo,intuitor,rent)",
    )
    parser.add_argument(
        "--steps", type=int, default=defaults.steps, help=f"RL steps per run (default {defaults.steps})"
    )
    parser.add_argument(
        "--seeds", type=int, default=5, help="seeds per estimator: --seed-start .. --seed-start+S-1 (default 5)"
    )
    parser.add_argument(
        "--seed-start",
        type=int,
        default=0,
        help="first seed (default 0); e.g. --seeds 20 --seed-start 100 runs seeds 100..119, fresh seeds for a "
        "confirmation",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/sandbox"), help="output folder (default runs/sandbox)")
    parser.add_argument("--levels", default=defaults.levels, help=f"difficulty levels (default {defaults.levels})")
    parser.add_argument(
        "--group-size",
        type=int,
        default=defaults.group_size,
        help=f"answers per prompt, G (default {defaults.group_size})",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        help=f"sampling temperature of the training rollouts (default {defaults.temperature:g}; pass@k is always "
        "sampled at 1.0)",
    )
    parser.add_argument(
        "--prompts-per-step",
        type=int,
        default=defaults.prompts_per_step,
        help=f"prompts per step (default {defaults.prompts_per_step})",
    )
    parser.add_argument(
        "--lr", type=float, default=defaults.lr, help=f"RL learning rate, AdamW (default {defaults.lr:g})"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=defaults.eval_every,
        help=f"evaluate every N steps (default {defaults.eval_every})",
    )
    parser.add_argument(
        "--eval-size",
        type=int,
        default=defaults.eval_size,
        help=f"held-out problems per level, at most (default {defaults.eval_size})",
    )
    parser.add_argument(
        "--loss-agg-mode",
        default=defaults.loss_agg_mode,
        help=f"verl's policy-loss aggregation (default {defaults.loss_agg_mode}; seq-mean-token-sum makes the "
        "beta_loo update unbiased, docs/method.md §6.3)",
    )
    parser.add_argument(
        "--max-gen-batches",
        type=int,
        default=defaults.max_gen_batches,
        help=f"dapo_resample: at most this many batches of --prompts-per-step prompts per step, as verl's "
        f"algorithm.filter_groups.max_num_gen_batches; +skip: at most this many candidate batches per step "
        f"(default {defaults.max_gen_batches})",
    )
    parser.add_argument(
        "--train-set",
        type=int,
        default=None,
        metavar="N",
        help="the epochs mode, as RLVR recipes train: draw a fixed set of N distinct training prompts once per seed "
        "(evenly over the levels) and train over it in epochs, each a fresh permutation without replacement (the "
        "skip rule's refills and dapo_resample's further batches draw on from the current epoch); choose N so that "
        "--steps x --prompts-per-step is at least 5 N, each prompt seen at least 5 times (default: draw every step's "
        "prompts with replacement from the levels' whole pools)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=defaults.policy.sft_steps,
        help=f"supervised warm-up steps (default {defaults.policy.sft_steps})",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path("runs/sandbox_cache"),
        help="where warmed-up models are cached, keyed by their settings (default runs/sandbox_cache)",
    )
    parser.add_argument("--no-cache", action="store_true", help="always redo the warm-up; cache nothing")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for determinism; default 1)")
    parser.add_argument(
        "--fingerprint",
        action="store_true",
        help="print, in seconds, a hash of the first warm-up steps' weights and of the first RL steps' samples "
        "(docs/results.md quotes the values of the default settings), and train nothing",
    )


def run_dir(out: Path, label: str) -> Path:
    """The folder of one estimator's runs (``avspo:paper_code`` -> ``avspo-paper_code``)."""
    return out / "runs" / label.replace(":", "-")


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


def _check_allocation(group_size: int, estimators) -> None:
    """Refuse a group size the allocator cannot plan around, naming the estimators given with +alloc."""
    from verl_avspo.core.prompt_allocation import allocation_problems

    for spec in estimators:
        allocation = spec.prompt_allocation(0)
        if allocation is not None and allocation_problems(allocation, group_size, "prompt_allocation", "G"):
            raise ValueError(
                f"--group-size={group_size} is invalid with {spec.label}: the rollout allocator's pilot of "
                f"{allocation.pilot_size} answers must be smaller than the group and its largest group of "
                f"{allocation.max_group_size} at least the group. Use --group-size between {allocation.pilot_size + 1} "
                f"and {allocation.max_group_size}, or drop +alloc"
            )


def _prompts_text(config) -> str:
    """Where the steps' prompts come from: the whole pools, or a fixed set in epochs."""
    if config.train_set is None:
        return "Each step draws its prompts with replacement from the levels' training pools."
    visits = config.steps * config.prompts_per_step // config.train_set
    return (
        f"Epochs mode: a fixed training set of {config.train_set} prompts per seed (evenly over the levels), drawn in "
        f"epochs without replacement, each prompt seen at least {visits} times by an estimator that draws "
        f"{config.prompts_per_step} prompts a step (more by one that re-samples or skips). `prompts/always_solved` "
        "and `prompts/never_solved` are the shares of the set that were all-correct or all-wrong on every visit."
    )


def _setup_text(config, estimators, seeds: range, first_steps: int) -> str:
    from verl_avspo.sandbox.summary import first_steps_column

    policy = config.policy
    rollouts = config.prompts_per_step * config.group_size
    return (
        f"Task: synthetic arithmetic, levels {config.levels} (`1+1` adds two 1-digit numbers, `2*1` multiplies a "
        f"2-digit by a 1-digit number), exact-match reward in {{0, 1}}, {config.eval_size} held-out problems per "
        "level at most (a fifth of a small level).\n"
        f"Policy: random-init {policy.architecture} ({policy.num_layers} layers, hidden {policy.hidden_size}, "
        f"character tokenizer), warmed up by {policy.sft_steps} supervised steps (shared by every run).\n"
        f"RL: {config.steps} steps x {config.prompts_per_step} prompts x G={config.group_size} answers = {rollouts} "
        f"rollouts per step for every estimator, temperature {config.temperature:g}, verl's `compute_advantage` "
        f"and `vanilla` PPO-clip loss (clip {config.clip_ratio}, {config.mini_batches} mini-batches, "
        f"`{config.loss_agg_mode}` aggregation), AdamW lr {config.lr}; seeds "
        f"{seeds[0]}..{seeds[-1]} (same seed: same prompts for every estimator). `dapo` samples the same rollouts "
        f"and drops collapsed groups from the loss (no re-sampling).{_resample_text(config, estimators)}"
        f"{_skip_text(config, estimators)}{_alloc_text(config, estimators)}"
        f"{_baselines_text(estimators)} {_prompts_text(config)}\n"
        f"Estimators: {', '.join(f'`{s.label}`' for s in estimators)}. ACR (raw) is measured on the rewards before "
        "any estimator; effective ACR is the fraction of groups whose final advantages are all zero (for GRPO it "
        "equals the raw ACR, so its two lines in `acr.png` coincide). "
        f"'{first_steps_column(first_steps)}' is the early-training ACR the paper found predictive of final accuracy.\n"
        "Accuracy and pass@k are at the last step; ± is the standard deviation over seeds."
    )


def _write_problem(folder: Path, flag: str, example: str) -> str | None:
    """Why ``folder`` cannot be written (None if it can), found without creating it
    (``core.files.check_folder``), so a refusal leaves no empty folder behind."""
    try:
        check_folder(folder)
    except FileWriteError as err:
        return f"{flag}: {err} (for example {flag} {example})"
    return None


def _check_max_gen_batches(max_gen_batches: int, estimators) -> None:
    """Refuse a cap below 1, naming the estimators given that draw more than one batch a step."""
    if max_gen_batches >= 1:
        return
    drawing = [spec.label for spec in estimators if spec.resample or spec.skip]
    who = (
        f"{', '.join(drawing)} {'draws' if len(drawing) == 1 else 'draw'} batches of --prompts-per-step prompts "
        "until the step has its prompts, and needs a cap of at least 1 batch"
        if drawing
        else "it caps the draws of dapo_resample and <estimator>+skip (none given here); leave it out"
    )
    raise ValueError(
        f"--max-gen-batches={max_gen_batches} is invalid: {who} (verl reads 0 as no limit, which loops forever once "
        "the policy solves every prompt; its DAPO recipes use 10)"
    )


def _fix_torch(threads: int) -> None:
    """The thread count and deterministic mode every sandbox computation runs under; a warning when
    the kernels could not be pinned."""
    import torch

    from verl_avspo.sandbox import kernels

    if not kernels.pinned():
        logger.warning("%s", kernels.describe())
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def _print_fingerprint(config, threads: int) -> int:
    from verl_avspo.sandbox.fingerprint import fingerprint

    _fix_torch(threads)
    print(fingerprint(config))
    return 0


def run(args: argparse.Namespace) -> int:
    # Validate everything before the (slow) verl import and any model is built.
    from verl_avspo.sandbox.config import SandboxConfig
    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.sandbox.task import parse_levels

    if args.seeds < 1:
        raise SystemExit(f"verl-avspo sandbox: --seeds={args.seeds} is invalid: expected at least 1 seed")
    if args.seed_start < 0:
        raise SystemExit(f"verl-avspo sandbox: --seed-start={args.seed_start} is invalid: expected a seed >= 0")
    if args.threads < 1:
        raise SystemExit(f"verl-avspo sandbox: --threads={args.threads} is invalid: expected at least 1")
    try:
        estimators = parse_estimators(args.estimators)
        _check_max_gen_batches(args.max_gen_batches, estimators)
        defaults = SandboxConfig()
        config = SandboxConfig(
            levels=args.levels,
            steps=args.steps,
            prompts_per_step=args.prompts_per_step,
            group_size=args.group_size,
            temperature=args.temperature,
            lr=args.lr,
            eval_every=args.eval_every,
            eval_size=args.eval_size,
            loss_agg_mode=args.loss_agg_mode,
            max_gen_batches=args.max_gen_batches,
            train_set=args.train_set,
            policy=replace(defaults.policy, sft_steps=args.sft_steps),
        )
        _check_allocation(config.group_size, estimators)
    except ValueError as err:
        raise SystemExit(f"verl-avspo sandbox: {err}") from err
    if args.fingerprint:
        return _print_fingerprint(config, args.threads)
    # Both folders checked before either is created: a refusal must not leave the other behind.
    folders = [(args.out, "--out", "runs/sandbox")]
    if not args.no_cache:
        folders.append((args.cache_dir, "--cache-dir", "runs/sandbox_cache"))
    problems = [problem for problem in (_write_problem(*folder) for folder in folders) if problem]
    if problems:
        raise SystemExit("\n".join(f"verl-avspo sandbox: {problem}" for problem in problems))
    for folder, _, _ in folders:
        folder.mkdir(parents=True, exist_ok=True)

    from verl_avspo.sandbox import kernels
    from verl_avspo.sandbox.loop import train
    from verl_avspo.sandbox.summary import render_summary, run_statistics
    from verl_avspo.tools.logs import read_metrics
    from verl_avspo.tools.plots import plot_metrics
    from verl_avspo.tools.stats import early_window

    _fix_torch(args.threads)
    level_names = [level.name for level in parse_levels(config.levels)]
    first_steps = early_window(config.steps)
    cache_dir = None if args.no_cache else args.cache_dir
    started = time.monotonic()
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    frames = {}
    for spec in estimators:
        frames[spec.label] = []
        for seed in seeds:
            log_path = run_dir(args.out, spec.label) / f"seed{seed}.jsonl"
            train(config, spec, seed, log_path, cache_dir)
            frames[spec.label].append(read_metrics(log_path))

    plots = [
        plot_metrics(
            frames,
            ["acr/rate", "acr/effective"],
            args.out / "acr.png",
            "Advantage collapse (mean over seeds, 5-step rolling mean)",
            "fraction of groups",
            smooth=5,
            column_labels={"acr/rate": "raw ACR", "acr/effective": "effective ACR"},
            band=False,
        ),
        plot_metrics(
            frames,
            ["eval/acc_mean"],
            args.out / "accuracy.png",
            "Held-out greedy accuracy, mean over levels (band: ± std over seeds)",
            "accuracy",
        ),
    ]
    stats = {
        label: [run_statistics(f, len(level_names), config.pass_k, first_steps) for f in runs]
        for label, runs in frames.items()
    }
    setup = f"{_setup_text(config, estimators, seeds, first_steps)}\n{kernels.describe()}"
    intrinsic = [spec.label for spec in estimators if spec.intrinsic]
    summary = render_summary(stats, level_names, config.pass_k, first_steps, setup, plots, intrinsic)
    write_text(args.out / "summary.md", summary)
    print(summary)
    print(
        f"Wrote {args.out / 'summary.md'}, {', '.join(str(p) for p in plots)} and the metrics JSONL under "
        f"{args.out / 'runs'} in {time.monotonic() - started:.0f} s."
    )
    return 0
