"""``verl-avspo sandbox``: a small, real RLVR comparison on CPU.

A tiny random-init causal LM, warmed up on synthetic arithmetic to a partial skill, is trained
with each estimator for each seed; every run writes verl-format metrics JSONL, and the command
writes ``summary.md`` (every estimator beside the warmed-up policy not trained, with the rollouts each
generated) and PNG curves of ACR and accuracy. See ``verl_avspo.sandbox.loop``. An ``--out`` that holds an
earlier run is refused before any training unless ``--force`` is given (then the earlier run's summary,
plots and logs are removed first, so that two runs never mix).
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

from verl_avspo.core.files import FileWriteError, check_folder, check_target, write_text

__all__ = ["configure", "run"]

logger = logging.getLogger(__name__)

# The files a sandbox run writes in --out, beside its logs (runs/<estimator>/seed<k>.jsonl).
OUTPUTS = ("summary.md", "acr.png", "accuracy.png")


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
        "--seeds", type=int, default=3, help="seeds per estimator: --seed-start .. --seed-start+S-1 (default 3)"
    )
    parser.add_argument(
        "--seed-start",
        type=int,
        default=0,
        help="first seed (default 0); e.g. --seeds 20 --seed-start 100 runs seeds 100..119, fresh seeds for a "
        "confirmation",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/sandbox"),
        help="output folder (default runs/sandbox); one that holds an earlier run needs --force",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the earlier run in --out: its summary.md, plots and runs/<estimator>/seed<k>.jsonl logs are "
        "removed before training, so that no old log stays beside the new ones",
    )
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
        "--lr-warmup-steps-ratio",
        type=float,
        default=defaults.lr_warmup_steps_ratio,
        help="the share of the steps over which the rate rises linearly from 0 to --lr, as verl's "
        f"actor.optim.lr_warmup_steps_ratio (default {defaults.lr_warmup_steps_ratio:.4g}: "
        f"{defaults.lr_warmup_steps} of {defaults.steps} steps)",
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
        "(evenly over the levels as far as each level's training pool goes) and train over it in epochs, each a "
        "fresh permutation without replacement (the skip rule's refills and dapo_resample's further batches draw on "
        "from the current epoch); choose N so that --steps x --prompts-per-step is at least 5 N, each prompt seen "
        "at least 5 times (a shorter run is refused before training, naming the --steps that would do); the "
        "calibrated epochs mode is 960 (docs/sandbox_calibration.md); default: draw every step's prompts with "
        "replacement from the levels' whole pools",
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
        help="print, in seconds, a hash of the first warm-up steps' weights and of the first RL steps' samples, "
        "and whether they match the machines docs/results.md quotes for the default settings; train nothing",
    )


def run_dir(out: Path, label: str) -> Path:
    """The folder of one estimator's runs (``avspo:paper_code`` -> ``avspo-paper_code``)."""
    return out / "runs" / label.replace(":", "-")


def _check_allocation(group_size: int, estimators) -> None:
    """Refuse a group size the allocator cannot plan around, naming the estimators given with +alloc."""
    from verl_avspo.core.prompt_allocation import allocation_problems

    for spec in estimators:
        allocation = spec.prompt_allocation(0, group_size)
        if allocation is not None and allocation_problems(allocation, group_size, "prompt_allocation", "G"):
            raise ValueError(
                f"--group-size={group_size} is invalid with {spec.label}: the rollout allocator's pilot of "
                f"{allocation.pilot_size} answers must be smaller than the group. Use --group-size of at least "
                f"{allocation.pilot_size + 1}, or drop +alloc"
            )


def _check_epochs(steps: int, prompts_per_step: int, train_set: int | None) -> None:
    """Refuse, before any training, an epochs run too short to visit each prompt ``MIN_EPOCHS`` times (a
    prompt's history predicts nothing for skipping and the allocator without visits), naming fixes the sandbox
    accepts: more steps, or a smaller set where one of at least a step's prompts would do."""
    from verl_avspo.sandbox.config import MIN_EPOCHS

    if train_set is None or min(steps, prompts_per_step) < 1 or train_set < prompts_per_step:
        return  # no epochs, or values SandboxConfig refuses with their own message
    draws = steps * prompts_per_step
    if draws // train_set >= MIN_EPOCHS:
        return
    fixes = [f"--steps {math.ceil(MIN_EPOCHS * train_set / prompts_per_step)} or more"]
    if draws // MIN_EPOCHS >= prompts_per_step:
        fixes.append(f"--train-set {draws // MIN_EPOCHS} or less")
    raise ValueError(
        f"--train-set={train_set} is too large for --steps={steps} x --prompts-per-step={prompts_per_step} = {draws} "
        f"prompt draws: some prompts would be seen {draws // train_set} time(s), fewer than the {MIN_EPOCHS} epochs "
        f"the epochs mode asks (skipping and the allocator act on prompts that recur). Use {' or '.join(fixes)}"
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


def _print_fingerprint(config, threads: int, defaults: bool) -> int:
    from verl_avspo.sandbox.fingerprint import fingerprint
    from verl_avspo.sandbox.fingerprint_match import fingerprint_verdict

    _fix_torch(threads)
    line = fingerprint(config)
    print(line)
    print(f"against docs/results.md: {fingerprint_verdict(line, defaults)}")
    return 0


def _earlier_run(out: Path, force: bool) -> list[Path]:
    """The files an earlier run left in ``out`` (its summary, plots and logs), each checked as `prompts --out`
    checks its target (``core.files.check_target``): refused without ``force``, and refused when not a file."""
    if not out.is_dir():
        return []
    found = [path for path in (out / name for name in OUTPUTS) if path.exists() or path.is_symlink()]
    found += sorted(out.glob("runs/*/seed*.jsonl"))
    if found and not force:
        names = [path.relative_to(out).as_posix() for path in found]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise FileWriteError(
            errno.EEXIST,
            f"--out {out} holds an earlier run ({shown}): pass --force to replace it (its summary, plots and logs "
            "are removed before training), or choose another --out",
        )
    for path in found:
        check_target(path, overwrite=True)
    return found


def _remove_earlier_run(out: Path, found: list[Path]) -> None:
    """Remove the earlier run's files (``_earlier_run``) and the log folders they leave empty."""
    for path in found:
        path.unlink()
    for folder in sorted({path.parent for path in found if path.parent != out}, reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    runs = out / "runs"
    if runs.is_dir() and not any(runs.iterdir()):
        runs.rmdir()
    if found:
        logger.warning("--force: removed the earlier run in %s (%d files)", out, len(found))


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
        _check_epochs(args.steps, args.prompts_per_step, args.train_set)
        defaults = SandboxConfig()
        config = SandboxConfig(
            levels=args.levels,
            steps=args.steps,
            prompts_per_step=args.prompts_per_step,
            group_size=args.group_size,
            temperature=args.temperature,
            lr=args.lr,
            lr_warmup_steps_ratio=args.lr_warmup_steps_ratio,
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
        return _print_fingerprint(config, args.threads, config == SandboxConfig())
    # Both folders checked before either is created: a refusal must not leave the other behind.
    folders = [(args.out, "--out", "runs/sandbox")]
    if not args.no_cache:
        folders.append((args.cache_dir, "--cache-dir", "runs/sandbox_cache"))
    problems = [problem for problem in (_write_problem(*folder) for folder in folders) if problem]
    try:
        earlier = _earlier_run(args.out, args.force)
    except FileWriteError as err:
        problems.append(str(err))
    if problems:
        raise SystemExit("\n".join(f"verl-avspo sandbox: {problem}" for problem in problems))
    _remove_earlier_run(args.out, earlier)
    for folder, _, _ in folders:
        folder.mkdir(parents=True, exist_ok=True)

    from verl_avspo.sandbox import kernels
    from verl_avspo.sandbox.loop import train
    from verl_avspo.sandbox.setup_text import setup_text
    from verl_avspo.sandbox.summary import NO_TRAINING, no_training_curve, render_summary, run_statistics
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
            {**frames, NO_TRAINING: no_training_curve(next(iter(frames.values())))},
            ["eval/acc_mean"],
            args.out / "accuracy.png",
            f"Held-out greedy accuracy, mean over levels (band: ± std over seeds; {NO_TRAINING}: the warmed-up "
            "policy's step-0 accuracy)",
            "accuracy",
        ),
    ]
    stats = {
        label: [run_statistics(f, len(level_names), config.pass_k, first_steps) for f in runs]
        for label, runs in frames.items()
    }
    setup = f"{setup_text(config, estimators, seeds, first_steps)}\n{kernels.describe()}"
    intrinsic = [spec.label for spec in estimators if spec.intrinsic]
    # Whose effective ACR is over the groups left after dropping collapsed ones, not given a signal.
    dropped = {
        spec.label: "collapsed pilots" if spec.budget_share is not None else "collapsed groups"
        for spec in estimators
        if spec.budget_share is not None or spec.resample
    }
    summary = render_summary(stats, level_names, config.pass_k, first_steps, setup, plots, intrinsic, dropped)
    write_text(args.out / "summary.md", summary)
    print(summary)
    print(
        f"Wrote {args.out / 'summary.md'}, {', '.join(str(p) for p in plots)} and the metrics JSONL under "
        f"{args.out / 'runs'} in {time.monotonic() - started:.0f} s."
    )
    return 0
