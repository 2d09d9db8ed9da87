"""The study of docs/results.md "Every arm on the calibrated instrument (pre-registered)": per-seed results to a
CSV, and every table and figure recomputed from that CSV alone.

``export`` reads ``<study>/<setting>/<arm>/runs/<arm>/seed<k>.jsonl`` (benchmarks/instrument_study.sh) and
writes one row per setting x arm x seed: the columns of the earlier studies
(:data:`rollouts_saved_report.COLUMNS` but the fixed target, which this study derives from GRPO's gain), the
candidates the allocator left unallocated, the curve (``acc_<step>`` and ``rollouts_<step>``: the accuracy in
points and the cumulative rollouts at each evaluation) and the final accuracy per level
(``final_acc_level_<level>``). The setting is in the column ``mix``, as in the earlier studies' CSVs.

``report`` reads that CSV and prints, per setting, as registered:

- the gate: GRPO's gain g over not training (its final accuracy minus its step-0 accuracy, paired by seed,
  one-sided paired t-test at alpha); the margin M = 0.2 g; the targets T50 and T90, each run's step-0
  accuracy plus 0.5 g and 0.9 g;
- (a) each arm's final accuracy against ``grpo`` (non-inferiority within M; better or worse) and its gain over
  not training;
- (b) each arm's accuracy at :data:`EQUAL_ROLLOUTS` cumulative rollouts against ``grpo``'s, and the plot of
  accuracy against cumulative rollouts;
- (c) cumulative rollouts to T50 and T90 as ratios to ``grpo`` and to ``dapo_resample`` (paired bootstrap);
- (d) rollouts per step against ``grpo``;
- the goal figures (to T90: below 0.5 of ``grpo``'s rollouts, below 0.25 of ``dapo_resample``'s, at
  non-inferior accuracy), the allocator's per-run counts, and the arms (the no-training row first) with
  their final accuracy per level.

Usage: python benchmarks/instrument_study_report.py export runs/instrument_study --csv docs/results/instrument_study.csv
       python benchmarks/instrument_study_report.py report docs/results/instrument_study.csv --out docs/results
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from verl_avspo.core.files import write_text
from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.task import parse_levels
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.seed_stats import mean_std_cell, paired_t
from verl_avspo.tools.stats import window_mean

sys.path.insert(0, str(Path(__file__).parent))
from rollout_plots import finished, plot_curves  # noqa: E402
from rollouts_saved_report import (  # noqa: E402
    BASELINE,
    LAST_EVALUATIONS,
    MAX_CENSORED,
    NO_TRAINING,
    RESAMPLER,
    _paired,
    _total,
    arm_table,
    bootstrap_ratio,
    curves,
    evaluation_steps,
    learning_gate,
    log_ratio_interval,
    no_training_rows,
    non_inferiority,
    ratio_verdict,
    rollouts_to_target,
    run_row,
)
from study_plots import load  # noqa: E402

# Pre-registered in docs/results.md.
ARMS = (BASELINE, "avspo", "grpo+alloc", "grpo+alloc=0.5", RESAMPLER, "dapo_resample+skip")
MARGIN_FRACTION = 0.2  # M, as a fraction of grpo's gain g
TARGET_SHARES = (0.5, 0.9)  # T50 and T90: a run's step-0 accuracy plus these shares of g
EQUAL_ROLLOUTS = 46_080  # outcome (b): grpo's cumulative rollouts at step 180 (180 x 16 prompts x G = 16)
GOAL_SHARE = 0.9  # the goal figures are read at T90
GOALS = {BASELINE: 0.5, RESAMPLER: 0.25}  # the upper end of the ratio's interval must lie below these
GOAL_ARMS = ("grpo+alloc", "grpo+alloc=0.5", "dapo_resample+skip")
# Per level (named as in --levels): the final accuracy and the step-0 accuracy, points.
FINAL_LEVEL, START_LEVEL = "final_acc_level_", "start_acc_level_"


def export(study: Path, levels: str = SandboxConfig().levels) -> pd.DataFrame:
    """Every finished run of ``study``'s settings, one row each, in setting, arm, seed order. ``levels`` names
    the runs' levels in their order (``eval/acc_level_<i>``); the study ran the sandbox's default levels."""
    names = [level.name for level in parse_levels(levels)]
    rows = []
    for setting in sorted(p for p in study.iterdir() if p.is_dir()):
        runs = {}
        for job in sorted(p for p in setting.iterdir() if (p / "runs").is_dir()):
            runs.update(load(job))
        for arm, frames in finished(runs).items() if runs else ():
            for frame in frames:
                row = run_row(frame, setting.name, arm, math.nan)
                del row["target"], row["rollouts_to_target"]
                row["prompts_unallocated"] = _total(frame, "prompts/unallocated")
                for index, name in enumerate(names, start=1):
                    accuracy = frame[f"eval/acc_level_{index}"]
                    row[FINAL_LEVEL + name] = 100 * window_mean(accuracy, LAST_EVALUATIONS)
                    row[START_LEVEL + name] = 100 * float(accuracy.loc[0])
                rows.append(row)
    if not rows:
        raise SystemExit(
            f"instrument_study_report: no run under {study}/<setting>/<arm>/runs/: run the study's run stage first"
        )
    table = pd.DataFrame(rows)
    order = {arm: i for i, arm in enumerate(ARMS)}
    return table.sort_values(["mix", "arm", "seed"], key=lambda c: c.map(order) if c.name == "arm" else c)


def with_targets(frame: pd.DataFrame, gain: float) -> pd.DataFrame:
    """``frame`` with, per run and share s of :data:`TARGET_SHARES`, ``target_<s>`` (its step-0 accuracy plus
    s x ``gain``, points) and ``rollouts_to_<s>`` (its cumulative rollouts at the first crossing, linearly
    interpolated; NaN when never reached) and ``equal_rollouts_acc`` (its accuracy at
    :data:`EQUAL_ROLLOUTS`; NaN when its run ended before)."""
    steps = evaluation_steps(frame)
    rollouts = frame[[f"rollouts_{s}" for s in steps]].to_numpy(float)
    accuracy = frame[[f"acc_{s}" for s in steps]].to_numpy(float)
    frame = frame.copy()
    for share in TARGET_SHARES:
        targets = frame["acc_0"].to_numpy(float) + share * gain
        frame[f"target_{_percent(share)}"] = targets
        frame[f"rollouts_to_{_percent(share)}"] = [
            rollouts_to_target(r, a, t) for r, a, t in zip(rollouts, accuracy, targets, strict=True)
        ]
    frame["equal_rollouts_acc"] = [
        float(np.interp(EQUAL_ROLLOUTS, r, a)) if r[-1] >= EQUAL_ROLLOUTS else math.nan
        for r, a in zip(rollouts, accuracy, strict=True)
    ]
    return frame


def _percent(share: float) -> str:
    return f"{100 * share:.0f}"


def _interval(test: dict, digits: int = 2) -> str:
    return (
        f"{test['mean']:+.{digits}f} ± {test['se']:.{digits}f} [{test['ci_low']:+.{digits}f}, "
        f"{test['ci_high']:+.{digits}f}]"
    )


def _difference_verdict(test: dict, above: str, below: str) -> str:
    """``above`` when the 95% interval of a paired difference lies above 0, ``below`` when below 0."""
    return above if test["ci_low"] > 0 else below if test["ci_high"] < 0 else "no detectable difference"


def _arms(frame: pd.DataFrame) -> list[str]:
    present = set(frame["arm"])
    return [arm for arm in ARMS if arm in present] + sorted(present - set(ARMS))


def outcome_a(frame: pd.DataFrame, margin: float, alpha: float, gated: bool) -> str:
    """Final accuracy at equal steps: each arm's gain over not training, and its difference from ``grpo``."""
    rows = []
    for arm in _arms(frame):
        runs = frame[frame["arm"] == arm]
        gain = paired_t((runs["final_acc"] - runs["acc_0"]).to_numpy(float))
        learned = "gained" if gain["p"] < alpha else "no gain shown"
        cells = [
            f"`{arm}`",
            mean_std_cell(runs["final_acc"].to_numpy(float), 1),
            _interval(gain),
            f"{gain['p']:.2g}: {learned}",
        ]
        if arm == BASELINE:
            rows.append([*cells, "—", "—", "—", "—"])
            continue
        test = non_inferiority(np.subtract(*_paired(frame, arm, BASELINE, "final_acc")), margin, alpha)
        verdict = test["verdict"] if gated else f"none (gate failed; {test['verdict']})"
        sign = _difference_verdict(test, "better", "worse")
        rows.append([*cells, _interval(test), f"{test['p']:.2g}", f"**{verdict}**", sign])
    header = [
        "arm",
        f"final accuracy (%, last {LAST_EVALUATIONS} evaluations)",
        "gain over not training (points, ± s.e.) [95% CI]",
        "one-sided p",
        f"− `{BASELINE}` (points, ± s.e.) [95% CI]",
        f"one-sided p (H0: mean ≤ −M = {-margin:+.2f})",
        "non-inferiority",
        f"against `{BASELINE}`",
    ]
    return render_table(header, rows)


def outcome_b(frame: pd.DataFrame) -> str:
    """Accuracy at :data:`EQUAL_ROLLOUTS` cumulative rollouts, each arm against ``grpo``, paired by seed."""
    rows = []
    for arm in _arms(frame):
        runs = frame[frame["arm"] == arm]
        values = runs["equal_rollouts_acc"]
        if values.isna().any():
            ended = runs["rollouts_cumulative"].max()
            rows.append([f"`{arm}`", f"— (its runs ended at or before {ended:,.0f} rollouts)", "—", "—"])
            continue
        cell = mean_std_cell(values.to_numpy(float), 1)
        if arm == BASELINE:
            rows.append([f"`{arm}`", cell, "—", "—"])
            continue
        test = paired_t(np.subtract(*_paired(frame, arm, BASELINE, "equal_rollouts_acc")))
        rows.append([f"`{arm}`", cell, _interval(test), _difference_verdict(test, "higher", "lower")])
    header = ["arm", f"accuracy at {EQUAL_ROLLOUTS:,} rollouts (%)", f"− `{BASELINE}` [95% CI]", "verdict"]
    return render_table(header, rows)


def rollout_ratio(frame: pd.DataFrame, arm: str, baseline: str, share: float) -> dict | None:
    """Cumulative rollouts to the ``share`` target, ``arm`` over ``baseline``: the ratio of the means over seeds
    with its paired bootstrap interval (a censored run counts with its total rollouts) and whether it is a
    bound (more than :data:`MAX_CENSORED` of either arm's runs censored); None without both arms, or where the
    baseline needed no rollouts (a target at or below its start)."""
    if arm == baseline or not {arm, baseline} <= set(frame["arm"]):
        return None
    column = f"rollouts_to_{_percent(share)}"
    censored = max(frame.loc[frame["arm"] == a, column].isna().mean() for a in (arm, baseline))
    bounded = frame.assign(**{column: frame[column].fillna(frame["rollouts_cumulative"])})
    ours, theirs = _paired(bounded, arm, baseline, column)
    if not theirs.mean() > 0:  # the baseline's runs started at the target: no ratio to 0 rollouts
        return None
    return {**bootstrap_ratio(ours, theirs), "bound": bool(censored > MAX_CENSORED)}


def _ratio_cells(result: dict | None, baseline: str) -> list[str]:
    if result is None:
        return ["—", "—"]
    cell = f"{result['ratio']:.3f} [{result['low']:.3f}, {result['high']:.3f}]"
    if result["bound"]:
        return [cell + " (bound: censored runs)", "a bound, no verdict"]
    return [cell, ratio_verdict(result["low"], result["high"], f"fewer than {baseline}", f"more than {baseline}")]


def outcome_c(frame: pd.DataFrame, share: float, gated: bool) -> str:
    """Rollouts to one target, each arm as a ratio to ``grpo`` and to ``dapo_resample``."""
    column = f"rollouts_to_{_percent(share)}"
    rows = []
    for arm in _arms(frame):
        runs = frame[frame["arm"] == arm]
        reached = runs[column].notna()
        mean = f"{runs.loc[reached, column].mean():,.0f}" if reached.any() else "—"
        cells = [f"`{arm}`", f"{int(reached.sum())} of {len(runs)}", mean]
        for baseline in (BASELINE, RESAMPLER):
            ratio_cells = _ratio_cells(rollout_ratio(frame, arm, baseline, share), baseline)
            if not gated and ratio_cells[1] != "—":
                ratio_cells[1] = f"none (gate failed; {ratio_cells[1]})"
            cells += ratio_cells
        rows.append(cells)
    header = [
        "arm",
        "runs that reached it",
        "rollouts to it (mean of those)",
        f"ratio to `{BASELINE}` [95% CI]",
        "verdict",
        f"ratio to `{RESAMPLER}` [95% CI]",
        "verdict",
    ]
    return render_table(header, rows)


def outcome_d(frame: pd.DataFrame) -> str:
    """Rollouts generated per step, each arm against ``grpo``: geometric mean of the per-seed ratios."""
    rows = []
    for arm in _arms(frame):
        runs = frame[frame["arm"] == arm]
        cell = mean_std_cell(runs["rollouts_per_step"].to_numpy(float), 1)
        if arm == BASELINE:
            rows.append([f"`{arm}`", cell, "—", "—"])
            continue
        ratio = log_ratio_interval(*_paired(frame, arm, BASELINE, "rollouts_per_step"))
        verdict = ratio_verdict(ratio["low"], ratio["high"], "saves rollouts", "costs rollouts")
        rows.append([f"`{arm}`", cell, f"{ratio['ratio']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]", verdict])
    return render_table(["arm", "rollouts per step", f"ratio to `{BASELINE}` [95% CI]", "verdict"], rows)


def goal_figures(frame: pd.DataFrame, margin: float, alpha: float, gated: bool) -> str:
    """The goal figures at T90: met iff each ratio's upper end lies below its goal, the ratio is an estimate and
    the final accuracy is non-inferior to ``grpo``'s."""
    rows = []
    for arm in [arm for arm in GOAL_ARMS if arm in set(frame["arm"])]:
        test = non_inferiority(np.subtract(*_paired(frame, arm, BASELINE, "final_acc")), margin, alpha)
        cells = [f"`{arm}`", test["verdict"]]
        for baseline, goal in GOALS.items():
            result = rollout_ratio(frame, arm, baseline, GOAL_SHARE)
            if result is None:
                cells += ["—", "—"]
                continue
            met = gated and not result["bound"] and result["high"] < goal and test["verdict"] == "non-inferior"
            cells += [
                f"{result['ratio']:.3f} [{result['low']:.3f}, {result['high']:.3f}]",
                f"**met** (below {goal:g})" if met else f"not met: needs the upper end below {goal:g}",
            ]
        rows.append(cells)
    header = [
        "arm",
        "final accuracy against `grpo`",
        f"rollouts to T{_percent(GOAL_SHARE)}, ratio to `{BASELINE}` [95% CI]",
        f"goal: {1 / GOALS[BASELINE]:g}× fewer",
        f"ratio to `{RESAMPLER}` [95% CI]",
        f"goal: {1 / GOALS[RESAMPLER]:g}× fewer",
    ]
    return render_table(header, rows)


def allocation_table(frame: pd.DataFrame) -> str:
    """The allocator's per-run counts: pilots and the share extended (prompts predicted to collapse that did
    not), rollouts beyond G as a share of all its rollouts (the budget that went to p near 1/2), candidates
    left unallocated. "" without an allocator arm."""
    runs = frame[frame["pilots"].fillna(0) > 0]
    rows = []
    for arm, group in runs.groupby("arm", sort=False):
        rows.append(
            [
                f"`{arm}`",
                mean_std_cell(group["pilots"].to_numpy(float), 0),
                mean_std_cell((group["pilots_extended"] / group["pilots"]).to_numpy(float), 3),
                mean_std_cell(group["extra_rollouts"].to_numpy(float), 0),
                mean_std_cell((group["extra_rollouts"] / group["rollouts_cumulative"]).to_numpy(float), 3),
                mean_std_cell(group["prompts_unallocated"].to_numpy(float), 0),
            ]
        )
    if not rows:
        return ""
    header = [
        "arm",
        "pilots per run",
        "share of pilots extended",
        "rollouts beyond G per run",
        "share of its rollouts beyond G",
        "candidates unallocated per run",
    ]
    return render_table(header, rows)


def level_table(frame: pd.DataFrame) -> str:
    """Final accuracy per level (mean ± std over seeds), the no-training row (each level's step-0 accuracy)
    first."""
    levels = [column[len(FINAL_LEVEL) :] for column in frame if column.startswith(FINAL_LEVEL)]
    starts = frame.groupby("seed")[[START_LEVEL + level for level in levels]].first()
    rows = [[f"*{NO_TRAINING}*"] + [mean_std_cell(starts[START_LEVEL + level].to_numpy(float), 1) for level in levels]]
    for arm in _arms(frame):
        runs = frame[frame["arm"] == arm]
        rows.append([f"`{arm}`"] + [mean_std_cell(runs[FINAL_LEVEL + level].to_numpy(float), 1) for level in levels])
    return render_table(["arm", *(f"`{level}`" for level in levels)], rows)


def report(table: pd.DataFrame, out: Path, alpha: float = 0.05, prefix: str = "instrument_study_") -> str:
    """The whole printed report, per setting, in registered order; writes one plot per setting under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for setting, frame in table.groupby("mix", sort=True):
        gate = learning_gate(frame, alpha, MARGIN_FRACTION)
        gain = gate["mean"]
        margin = MARGIN_FRACTION * gain
        frame = with_targets(frame, gain)
        untrained = float(no_training_rows(frame)["final_acc"].mean())
        targets = tuple(float(frame[f"target_{_percent(s)}"].mean()) for s in TARGET_SHARES)
        path = out / f"{prefix}{setting}_accuracy_per_rollout.png"
        title = f"{setting}: held-out accuracy per rollout (mean, band ± std over seeds)"
        plot_curves(curves(frame), title, path, targets=targets, untrained=untrained)
        outcome = "passed" if gate["passed"] else "**failed**: no verdict below is read as a saving or non-inferiority"
        part = [
            f"## {setting}",
            f"- *{NO_TRAINING}*: {mean_std_cell(no_training_rows(frame)['final_acc'].to_numpy(float), 2)}%",
            f"- `{BASELINE}`'s gain g over not training: {gate['mean']:+.2f} ± {gate.get('se', math.nan):.2f} (s.e.), "
            f"95% CI [{gate.get('ci_low', math.nan):+.2f}, {gate.get('ci_high', math.nan):+.2f}], one-sided "
            f"p = {gate.get('p', math.nan):.2g}: the gate {outcome}",
            f"- margin M = {MARGIN_FRACTION:g} g = {margin:.2f} points; targets (mean over seeds) "
            + ", ".join(f"T{_percent(s)} = {t:.2f}%" for s, t in zip(TARGET_SHARES, targets, strict=True)),
            f"\n### (a) final accuracy at equal steps\n\n{outcome_a(frame, margin, alpha, gate['passed'])}",
            f"\n### (b) accuracy at equal cumulative rollouts\n\n{outcome_b(frame)}\n\n![{path.stem}]({path.name})",
        ]
        for share in TARGET_SHARES:
            part.append(
                f"\n### (c) cumulative rollouts to T{_percent(share)} (paired bootstrap)\n\n"
                f"{outcome_c(frame, share, gate['passed'])}"
            )
        part.append(f"\n### (d) rollouts per step\n\n{outcome_d(frame)}")
        part.append(
            f"\n### Goal figures (to T{_percent(GOAL_SHARE)})\n\n{goal_figures(frame, margin, alpha, gate['passed'])}"
        )
        allocation = allocation_table(frame)
        if allocation:
            part.append(f"\n### The allocator's counts\n\n{allocation}")
        part.append(f"\n### Arms\n\n{arm_table(frame)}\n\nFinal accuracy per level (%):\n\n{level_table(frame)}")
        parts.append("\n".join(part) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="per-seed results of the study's runs to a CSV")
    exporting.add_argument(
        "study", type=Path, help="the study's folder: <study>/<setting>/<arm>/runs/<arm>/seed<k>.jsonl"
    )
    exporting.add_argument("--csv", type=Path, required=True)
    reporting = commands.add_parser("report", help="every table and plot, from the CSV alone")
    reporting.add_argument("csv", type=Path)
    reporting.add_argument("--out", type=Path, default=Path("docs/results"), help="where the plots go")
    reporting.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.command == "export":
        rows = export(args.study)
        write_text(args.csv, rows.to_csv(index=False))
        print(f"wrote {len(rows)} runs to {args.csv}")
    else:
        print(report(pd.read_csv(args.csv), args.out, args.alpha))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
