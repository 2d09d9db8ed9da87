"""The studies of docs/results.md "Rollouts saved by skipping (pre-registered)" and "Rollouts per prompt
from the history (pre-registered)": per-seed results to a CSV, and every table and figure recomputed from
that CSV alone. The defaults are the first study's; the second names its pairs, baselines and target gains
(``benchmarks/rollout_allocation_study.sh``).

``export`` reads ``<study>/<mix>/runs/<arm>/seed<k>.jsonl`` (benchmarks/rollouts_saved_study.sh) and
writes one row per arm x mix x seed (:data:`COLUMNS`, then ``acc_<step>`` and ``rollouts_<step>``,
the accuracy in points and the cumulative rollouts at each evaluation step: the curves).

``report`` reads that CSV and prints, per mix:

- primary (a): each ``--pairs`` arm against its baseline (default ``dapo_resample+skip`` against
  ``dapo_resample``), paired by seed: the ratio of their
  rollouts generated per step (geometric mean of the per-seed ratios, with the t interval of the mean
  log-ratio, exponentiated) and the non-inferiority of the final accuracy at equal steps: per seed
  d = final(+skip) − final(dapo_resample), one-sided paired t-test of H0: mean d ≤ −margin at alpha;
  non-inferior iff p < alpha (equivalently, the lower end of the two-sided 1 − 2 alpha interval is
  above −margin), inferior iff the 95% interval of mean d lies below −margin, else inconclusive; the
  ratio saves (costs) rollouts iff its interval lies below (above) 1;
- primary (b): each arm's cumulative rollouts to reach the mix's target accuracy (the first crossing
  of its accuracy curve, linearly interpolated between evaluations) as a ratio to each ``--baselines``
  arm (default ``grpo``): the ratio
  of the means over seeds, with a paired bootstrap interval over seeds. A run that never reaches the
  target is censored: it counts with its total rollouts, a lower bound; where more than a fifth of
  either arm's runs are censored the ratio is marked a bound, with no verdict; otherwise an arm needs
  fewer (more) rollouts than the baseline iff the interval lies below (above) 1;
- the per-arm table (final accuracy, rollouts per step and in all, raw ACR, skip and allocation counts,
  shares of the training set always and never solved) and ``<prefix><mix>_accuracy_per_rollout.png`` under
  ``--out``.

Every mix also gets the **no-training row** (:data:`NO_TRAINING`: the warmed-up policy, its step-0 evaluation
held as its final accuracy, 0 rollouts) and a **gate**: ``grpo``'s final accuracy against it, paired by seed,
one-sided paired t-test of a gain at ``--alpha``. The registered verdicts above are printed as registered,
and beside each a gated one: a study may call an arm non-inferior, or say it saves rollouts, only on a mix
where ``grpo`` beat not training, with a margin of ``--margin-fraction`` (default 20%) of ``grpo``'s measured
gain instead of fixed points; elsewhere the gated verdict is "none". The gate section also applies the
registered non-inferiority test to not training itself, against ``grpo``.

Usage: python benchmarks/rollouts_saved_report.py export runs/rollouts_saved --csv docs/results/rollouts_saved.csv
       python benchmarks/rollouts_saved_report.py report docs/results/rollouts_saved.csv --out docs/results
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from verl_avspo.core.files import write_text
from verl_avspo.tools.markdown import render_table
from verl_avspo.tools.seed_stats import mean_std_cell, paired_t
from verl_avspo.tools.stats import FINAL_EVALUATIONS, window_mean

sys.path.insert(0, str(Path(__file__).parent))
from rollout_plots import ACC, ROLLOUTS, curve, finished, plot_curves  # noqa: E402
from study_plots import load  # noqa: E402

BASELINE, RESAMPLER, SKIPPER = "grpo", "dapo_resample", "dapo_resample+skip"
# Pre-registered in docs/results.md: the evaluations averaged into a run's final accuracy; outcome (b)'s
# target per mix, as a gain (points) over the mix's start (the warmed-up policy's step-0 accuracy, the mean
# over the mix's runs: every run of a mix starts from the same warm-up); the non-inferiority margin of
# outcome (a) (points).
LAST_EVALUATIONS = FINAL_EVALUATIONS  # 5, as registered
TARGET_GAINS = {"easy": 8.0, "hard": 1.0}
MARGIN = 1.5
# The gated verdicts' non-inferiority margin, as a fraction of grpo's gain over not training on the mix.
MARGIN_FRACTION = 0.2
# The arm that is never trained: the warmed-up policy, its step-0 evaluation held, 0 rollouts.
NO_TRAINING = "no training"
# A ratio to grpo is an estimate only when at most this share of either arm's runs is censored.
MAX_CENSORED = 0.2
BOOTSTRAP_DRAWS, BOOTSTRAP_SEED = 10_000, 0

COLUMNS = [
    "mix",
    "arm",
    "seed",
    "steps",
    "target",
    "final_acc",  # points: the mean of the last LAST_EVALUATIONS evaluations
    "rollouts_per_step",  # mean of train/rollouts_generated over the training steps
    "rollouts_cumulative",  # at the last step
    "rollouts_to_target",  # first crossing of the target; NaN when never reached (censored)
    "raw_acr",  # mean acr/rate over the training steps
    "prompts_skipped",  # sums over the run (0 without the skip rule)
    "prompts_reselected",
    "rollouts_skipped",
    "always_solved",  # shares of the prompts seen, at the last step
    "never_solved",
    "pilots",  # sums over the run (0 without the rollout allocator)
    "pilots_extended",
    "extra_rollouts",
]


def rollouts_to_target(rollouts: np.ndarray, accuracy: np.ndarray, target: float) -> float:
    """The cumulative rollouts at which the accuracy curve (points, at the evaluations) first reaches
    ``target``, linearly interpolated between the two evaluations around the crossing; NaN when it
    never does."""
    above = np.flatnonzero(accuracy >= target)
    if not above.size:
        return math.nan
    i = above[0]
    if i == 0:
        return float(rollouts[0])
    share = (target - accuracy[i - 1]) / (accuracy[i] - accuracy[i - 1])
    return float(rollouts[i - 1] + share * (rollouts[i] - rollouts[i - 1]))


def _total(frame: pd.DataFrame, column: str) -> float:
    return float(frame[column].sum()) if column in frame else 0.0


def _last(frame: pd.DataFrame, column: str) -> float:
    values = frame[column].dropna() if column in frame else pd.Series(dtype=float)
    return float(values.iloc[-1]) if len(values) else math.nan


def evaluation_steps(table: pd.DataFrame) -> list[int]:
    """The evaluation steps of a CSV's curve columns (``acc_<step>``), in order."""
    return sorted(int(column[4:]) for column in table if column.startswith("acc_"))


def run_row(frame: pd.DataFrame, mix: str, arm: str, target: float, last: int = LAST_EVALUATIONS) -> dict:
    """One run's row of the CSV (:data:`COLUMNS`, then its curve)."""
    rollouts, accuracy = curve(frame)
    steps = frame[frame[ACC].notna()].index
    training = frame[frame["acr/rate"].notna()]
    row = {
        "mix": mix,
        "arm": arm,
        "seed": frame.attrs["seed"],
        "steps": int(frame.index.max()),
        "target": target,
        "final_acc": window_mean(pd.Series(accuracy), last),
        "rollouts_per_step": float(training["train/rollouts_generated"].mean()),
        "rollouts_cumulative": float(frame[ROLLOUTS].dropna().iloc[-1]),
        "rollouts_to_target": rollouts_to_target(rollouts, accuracy, target),
        "raw_acr": float(training["acr/rate"].mean()),
        "prompts_skipped": _total(frame, "prompts/skipped"),
        "prompts_reselected": _total(frame, "prompts/reselected"),
        "rollouts_skipped": _total(frame, "prompts/rollouts_skipped"),
        "always_solved": _last(frame, "prompts/always_solved"),
        "never_solved": _last(frame, "prompts/never_solved"),
        "pilots": _total(frame, "prompts/pilots"),
        "pilots_extended": _total(frame, "prompts/pilots_extended"),
        "extra_rollouts": _total(frame, "prompts/extra_rollouts"),
    }
    row.update({f"acc_{step}": value for step, value in zip(steps, accuracy, strict=True)})
    row.update({f"rollouts_{step}": value for step, value in zip(steps, rollouts, strict=True)})
    return row


def start_accuracy(frames: list[pd.DataFrame]) -> float:
    """The mean step-0 accuracy (points) of a mix's runs: where the warmed-up policy starts."""
    return float(np.mean([curve(frame)[1][0] for frame in frames]))


def no_training_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One mix's no-training row, one per seed: the warmed-up policy's step-0 accuracy (every run of a seed
    starts from it) as its final accuracy and at every evaluation, 0 rollouts, no ACR, nothing skipped."""
    starts = frame.groupby("seed", sort=True)["acc_0"].first()
    steps = evaluation_steps(frame)
    # A fixed target where the CSV has one; the instrument study derives its targets in its report.
    target = {}
    if "target" in frame:
        value = float(frame["target"].iloc[0])
        target = {"target": value, "rollouts_to_target": np.where(starts.to_numpy() >= value, 0.0, math.nan)}
    rows = pd.DataFrame(
        {
            "mix": frame["mix"].iloc[0],
            "arm": NO_TRAINING,
            "seed": starts.index,
            "steps": frame["steps"].max(),
            **target,
            "final_acc": starts.to_numpy(),
            "rollouts_per_step": 0.0,
            "rollouts_cumulative": 0.0,
            "raw_acr": math.nan,
            **{column: 0.0 for column in COLUMNS if column in frame and column.startswith(("prompts_", "rollouts_s"))},
            **{column: 0.0 for column in ("pilots", "pilots_extended", "extra_rollouts") if column in frame},
            "always_solved": math.nan,
            "never_solved": math.nan,
        }
    )
    for step in steps:
        rows[f"acc_{step}"], rows[f"rollouts_{step}"] = starts.to_numpy(), 0.0
    return rows


def learning_gate(frame: pd.DataFrame, alpha: float, fraction: float, baseline: str = BASELINE) -> dict:
    """Did ``baseline`` beat not training on one mix? Per seed d = final(``baseline``) − its step-0 accuracy;
    one-sided paired t-test of mean d > 0 at ``alpha`` (:func:`verl_avspo.tools.seed_stats.paired_t`).
    ``passed`` iff p < alpha; then ``margin`` = ``fraction`` × mean d, the gated verdicts' margin (None otherwise)."""
    runs = frame[frame["arm"] == baseline]
    gains = (runs["final_acc"] - runs["acc_0"]).to_numpy(float)
    if len(gains) < 2:
        mean = float(gains.mean()) if len(gains) else math.nan
        return {"n": len(gains), "mean": mean, "passed": False, "margin": None}
    test = paired_t(gains)
    passed = bool(test["p"] < alpha)
    margin = fraction * test["mean"] if passed else None
    return {**test, "higher": int((gains > 0).sum()), "passed": passed, "margin": margin}


def gate_section(frame: pd.DataFrame, margin: float, alpha: float, fraction: float, baseline: str = BASELINE) -> str:
    """The gate as markdown lines: the no-training row, ``baseline``'s gain over it with its test, the gated
    margin or why there is none, and the registered non-inferiority test applied to not training."""
    if baseline not in set(frame["arm"]):
        return f"- no `{baseline}` run on this mix: no gate, so no gated verdict"
    gate = learning_gate(frame, alpha, fraction, baseline)
    untrained = no_training_rows(frame)
    lines = [
        f"- *{NO_TRAINING}* (the warmed-up policy, its step-0 evaluation held, 0 rollouts): "
        f"{mean_std_cell(untrained['final_acc'].to_numpy(float), 2)}%"
    ]
    if gate["n"] < 2:
        single = f"- `{baseline}` − *{NO_TRAINING}*: {gate['mean']:+.2f} from 1 seed: no test below 2 seeds, no gate"
        return "\n".join([*lines, single])
    outcome = (
        f"**`{baseline}` beat not training**: the gated margin is {100 * fraction:g}% of that gain, "
        f"{gate['margin']:.2f} points"
        if gate["passed"]
        else f"**`{baseline}` did not beat not training**: no arm of this mix is called non-inferior or said to save "
        "rollouts (gated verdict: none)"
    )
    lines.append(
        f"- `{baseline}` − *{NO_TRAINING}* (final accuracy, paired by seed): {gate['mean']:+.2f} ± {gate['se']:.2f} "
        f"(s.e.), 95% CI [{gate['ci_low']:+.2f}, {gate['ci_high']:+.2f}], higher in {gate['higher']} of {gate['n']} "
        f"seeds, one-sided p = {gate['p']:.4f}: {outcome}"
    )
    both = pd.concat([frame, untrained], ignore_index=True)
    test = non_inferiority(np.subtract(*_paired(both, NO_TRAINING, baseline, "final_acc")), margin, alpha)
    lines.append(
        f"- the registered test applied to *{NO_TRAINING}* against `{baseline}` (margin −{margin:g}): "
        f"{test['mean']:+.2f} ± {test['se']:.2f} (s.e.), one-sided p = {test['p']:.4f}: **{test['verdict']}**"
        + (": not training passes it too" if test["verdict"] == "non-inferior" else "")
    )
    return "\n".join(lines)


def export(
    study: Path, targets: dict[str, float] | None = None, last: int = LAST_EVALUATIONS, gains: dict | None = None
) -> pd.DataFrame:
    """Every finished run of ``study``'s mixes, one row each, in mix, arm, seed order. A mix's target is
    ``targets[mix]`` (points) if given, else its start accuracy plus ``gains[mix]`` (:data:`TARGET_GAINS`)."""
    targets, gains = targets or {}, TARGET_GAINS if gains is None else gains
    rows = []
    for mix in sorted(p for p in study.iterdir() if (p / "runs").is_dir()):
        if mix.name not in targets and mix.name not in gains:
            raise SystemExit(
                f"rollouts_saved_report: no target for mix {mix.name!r}: pass --target {mix.name}=<points>"
            )
        runs = finished(load(mix))
        target = targets.get(mix.name)
        if target is None:
            target = round(start_accuracy([f for frames in runs.values() for f in frames]) + gains[mix.name], 2)
        for arm, frames in runs.items():
            rows += [run_row(frame, mix.name, arm, target, last) for frame in frames]
    if not rows:
        raise SystemExit(f"rollouts_saved_report: no run under {study}/<mix>/runs/: run the study's run stage first")
    return pd.DataFrame(rows)


def log_ratio_interval(numerator: np.ndarray, denominator: np.ndarray, confidence: float = 0.95) -> dict:
    """Paired ratio of positive values: the geometric mean of numerator / denominator over seeds,
    and the t interval of the mean log-ratio, exponentiated."""
    t = paired_t(np.log(numerator / denominator), confidence)
    return {"n": t["n"], "ratio": math.exp(t["mean"]), "low": math.exp(t["ci_low"]), "high": math.exp(t["ci_high"])}


def non_inferiority(differences: np.ndarray, margin: float, alpha: float) -> dict:
    """One-sided paired t-test of H0: mean difference <= −margin against H1: > −margin: the mean
    difference with its two-sided 95% interval (``ci_low``, ``ci_high``), ``t`` and ``p`` of the test,
    ``lower`` the one-sided (1 − alpha) bound. The verdict: *non-inferior* iff p < alpha; *inferior*
    iff the 95% interval lies below −margin; otherwise *inconclusive*."""
    plain, shifted = paired_t(differences), paired_t(differences + margin)
    lower = paired_t(differences, 1 - 2 * alpha)["ci_low"]
    verdict = "non-inferior" if shifted["p"] < alpha else "inferior" if plain["ci_high"] < -margin else "inconclusive"
    return {**plain, "t": shifted["t"], "p": shifted["p"], "lower": lower, "verdict": verdict}


def ratio_verdict(low: float, high: float, below: str, above: str) -> str:
    """``below`` when the interval [low, high] of a ratio lies below 1, ``above`` when above 1, else
    "no detectable difference"."""
    return below if high < 1 else above if low > 1 else "no detectable difference"


def bootstrap_ratio(
    numerator: np.ndarray,
    denominator: np.ndarray,
    confidence: float = 0.95,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """mean(numerator) / mean(denominator) over seeds (paired: element i of both is seed i), and the
    percentile interval of that ratio over ``draws`` resamplings of the seeds with replacement."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(numerator), size=(draws, len(numerator)))
    ratios = numerator[picks].mean(axis=1) / denominator[picks].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return {"ratio": float(numerator.mean() / denominator.mean()), "low": float(low), "high": float(high)}


def _paired(frame: pd.DataFrame, arm: str, baseline: str, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``column`` of ``arm`` and ``baseline`` on the seeds both ran, in seed order."""
    ours = frame[frame["arm"] == arm].set_index("seed")[column]
    theirs = frame[frame["arm"] == baseline].set_index("seed")[column]
    seeds = sorted(set(ours.index) & set(theirs.index))
    return ours.loc[seeds].to_numpy(float), theirs.loc[seeds].to_numpy(float)


def primary_a(
    frame: pd.DataFrame,
    margin: float,
    alpha: float,
    arm: str = SKIPPER,
    baseline: str = RESAMPLER,
    gate: dict | None = None,
) -> str:
    """Outcome (a), ``arm`` against ``baseline``, on one mix's rows, as markdown lines ("" without both arms):
    the registered verdicts and, given the mix's ``gate`` (:func:`learning_gate`), the gated ones."""
    if not {arm, baseline} <= set(frame["arm"]):
        return ""
    per_step = _paired(frame, arm, baseline, "rollouts_per_step")
    if len(per_step[0]) < 2:  # a smoke run: no spread, so neither interval nor test
        return (
            f"- rollouts per step, `{arm}` / `{baseline}`: {per_step[0].mean() / per_step[1].mean():.3f} from "
            f"{len(per_step[0])} seed in common: no interval or test below 2 seeds"
        )
    ratio = log_ratio_interval(*per_step)
    test = non_inferiority(np.subtract(*_paired(frame, arm, baseline, "final_acc")), margin, alpha)
    saving = ratio_verdict(ratio["low"], ratio["high"], "saves rollouts", "costs rollouts")
    registered = (
        f"- rollouts per step, `{arm}` / `{baseline}`: {ratio['ratio']:.3f} (geometric mean over "
        f"{ratio['n']} seeds), 95% CI [{ratio['low']:.3f}, {ratio['high']:.3f}]: **{saving}**\n"
        f"- final accuracy, `{arm}` − `{baseline}` at equal steps: {test['mean']:+.2f} ± {test['se']:.2f} "
        f"(s.e.), 95% CI [{test['ci_low']:+.2f}, {test['ci_high']:+.2f}], one-sided {100 * (1 - alpha):g}% lower "
        f"bound {test['lower']:+.2f} against the margin −{margin:g}, t = {test['t']:.2f}, p = {test['p']:.4f}: "
        f"**{test['verdict']}**"
    )
    if gate is None:
        return registered
    if not gate["passed"]:
        return f"{registered}\n- gated: **none**: `{BASELINE}` did not beat not training on this mix"
    gated = non_inferiority(np.subtract(*_paired(frame, arm, baseline, "final_acc")), gate["margin"], alpha)
    return (
        f"{registered}\n- gated (margin −{gate['margin']:.2f}, {100 * gate['margin'] / gate['mean']:g}% of "
        f"`{BASELINE}`'s gain over not training): one-sided p = {gated['p']:.4f}: **{gated['verdict']}**; "
        f"**{saving}**"
    )


def primary_b(frame: pd.DataFrame, baseline: str = BASELINE, gate: dict | None = None) -> str:
    """Outcome (b) on one mix's rows: a markdown table, one row per arm against ``baseline``; given the mix's
    ``gate`` (:func:`learning_gate`), a line under it saying whether its verdicts may be read as savings."""
    rows = []
    for arm in frame["arm"].unique():
        runs = frame[frame["arm"] == arm]
        reached = runs["rollouts_to_target"].notna()
        cell, verdict = "—", "—"
        if arm != baseline and baseline in set(frame["arm"]):
            # A censored run counts with its total rollouts: a lower bound on its rollouts to target.
            bounded = frame.assign(rollouts_to_target=frame["rollouts_to_target"].fillna(frame["rollouts_cumulative"]))
            ours, theirs = _paired(bounded, arm, baseline, "rollouts_to_target")
            result = bootstrap_ratio(ours, theirs)
            censored = max(_censored_share(frame, arm), _censored_share(frame, baseline))
            bound = censored > MAX_CENSORED
            cell = f"{result['ratio']:.3f} [{result['low']:.3f}, {result['high']:.3f}]" + (
                " (bound: censored runs)" if bound else ""
            )
            verdict = (
                "a bound, no verdict"
                if bound
                else ratio_verdict(result["low"], result["high"], f"fewer than {baseline}", f"more than {baseline}")
            )
        mean = f"{runs.loc[reached, 'rollouts_to_target'].mean():.0f}" if reached.any() else "—"
        rows.append([f"`{arm}`", f"{int(reached.sum())} of {len(runs)}", mean, cell, verdict])
    header = [
        "arm",
        "runs that reached the target",
        "rollouts to target (mean of those)",
        f"ratio to {baseline} [95% CI]",
        "rollouts to target",
    ]
    table = render_table(header, rows)
    if gate is None:
        return table
    if gate["passed"]:
        return f"{table}\n\n- gated: `{BASELINE}` beat not training on this mix: the verdicts above stand"
    return (
        f'{table}\n\n- gated: **none**: `{BASELINE}` did not beat not training on this mix, so no "fewer" above is a '
        "saving"
    )


def _censored_share(frame: pd.DataFrame, arm: str) -> float:
    return float(frame.loc[frame["arm"] == arm, "rollouts_to_target"].isna().mean())


def arm_table(frame: pd.DataFrame) -> str:
    """One mix's arms, the no-training row first: mean ± std over seeds of the CSV's per-run numbers."""
    frame = pd.concat([no_training_rows(frame), frame], ignore_index=True)
    columns = [  # (CSV column, digits, header)
        ("final_acc", 1, f"final accuracy (%, last {LAST_EVALUATIONS} evaluations)"),
        ("rollouts_per_step", 0, "rollouts per step"),
        ("rollouts_cumulative", 0, "rollouts in all"),
        ("raw_acr", 3, "raw ACR"),
        ("prompts_skipped", 0, "prompts skipped"),
        ("rollouts_skipped", 0, "rollouts skipped (places left open)"),
        ("always_solved", 3, "always solved"),
        ("never_solved", 3, "never solved"),
    ]
    # The rollout allocator's counts, where an arm used it (the first study's CSV has no such column).
    allocation = [
        ("pilots", 0, "pilots"),
        ("pilots_extended", 0, "pilots extended"),
        ("extra_rollouts", 0, "rollouts beyond G"),
    ]
    if all(column in frame for column, _, _ in allocation) and frame["pilots"].fillna(0).gt(0).any():
        columns += allocation
    rows = [
        [f"*{arm}*" if arm == NO_TRAINING else f"`{arm}`", str(len(runs))]
        + [mean_std_cell(runs[column].to_numpy(float), digits) for column, digits, _ in columns]
        for arm, runs in frame.groupby("arm", sort=False)
    ]
    return render_table(["arm", "seeds", *(header for _, _, header in columns)], rows)


def curves(frame: pd.DataFrame) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """Per arm, each run's (cumulative rollouts, accuracy) at its evaluations, from the CSV's columns."""
    steps = evaluation_steps(frame)
    result = {}
    for arm, runs in frame.groupby("arm", sort=False):
        result[arm] = []
        for _, run in runs.iterrows():
            done = [s for s in steps if not math.isnan(run[f"acc_{s}"])]
            result[arm].append(
                (run[[f"rollouts_{s}" for s in done]].to_numpy(float), run[[f"acc_{s}" for s in done]].to_numpy(float))
            )
    return result


def report(
    table: pd.DataFrame,
    out: Path,
    margin: float,
    alpha: float,
    prefix: str = "rollouts_saved_",
    pairs: tuple[tuple[str, str], ...] = ((SKIPPER, RESAMPLER),),
    baselines: tuple[str, ...] = (BASELINE,),
    fraction: float = MARGIN_FRACTION,
) -> str:
    """The whole printed report: per mix the gate (``grpo`` against not training, :func:`gate_section`),
    outcome (a) for each (arm, baseline) of ``pairs``, outcome (b) against each of ``baselines``, each with
    its gated verdict, and the arms with the no-training row; writes one plot per mix under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for mix, frame in table.groupby("mix", sort=True):
        target = float(frame["target"].iloc[0])
        path = out / f"{prefix}{mix}_accuracy_per_rollout.png"
        title = f"{mix}: held-out accuracy per rollout (mean, band ± std over seeds)"
        untrained = float(no_training_rows(frame)["final_acc"].mean())
        plot_curves(curves(frame), title, path, targets=(target,), untrained=untrained)
        gate = learning_gate(frame, alpha, fraction)
        part = (
            f"## {mix}\n\n### Gate: `{BASELINE}` against not training\n\n"
            f"{gate_section(frame, margin, alpha, fraction)}\n\n"
        )
        for arm, baseline in pairs:
            part += f"### (a) `{arm}` vs `{baseline}`\n\n{primary_a(frame, margin, alpha, arm, baseline, gate)}\n\n"
        for baseline in baselines:
            part += (
                f"### (b) cumulative rollouts to reach {target:g}% (ratio to `{baseline}`, paired bootstrap)\n\n"
                f"{primary_b(frame, baseline, gate)}\n\n"
            )
        parts.append(part + f"### Arms\n\n{arm_table(frame)}\n\n![{path.stem}]({path.name})\n")
    return "\n".join(parts)


def _targets(text: str) -> dict[str, float]:
    try:
        return {mix: float(value) for mix, value in (item.split("=", 1) for item in text.split(","))}
    except ValueError as err:
        raise SystemExit(f"rollouts_saved_report: --target {text!r} is invalid: write mix=points,... ({err})") from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="per-seed results of the study's runs to a CSV")
    exporting.add_argument("study", type=Path, help="the study's folder: <study>/<mix>/runs/<arm>/seed<k>.jsonl")
    exporting.add_argument("--csv", type=Path, required=True)
    exporting.add_argument(
        "--target",
        default=None,
        help="target accuracy per mix, points, as mix=points,... (default: the registered gain over each mix's "
        "start, " + ", ".join(f"{mix} +{gain:g}" for mix, gain in TARGET_GAINS.items()) + ")",
    )
    exporting.add_argument(
        "--gain", default=None, help="the target as a gain over each mix's start, points, as mix=points,..."
    )
    reporting = commands.add_parser("report", help="every table and plot, from the CSV alone")
    reporting.add_argument("csv", type=Path)
    reporting.add_argument("--out", type=Path, default=Path("docs/results"), help="where the plots go")
    reporting.add_argument("--margin", type=float, default=MARGIN, help="non-inferiority margin, points")
    reporting.add_argument("--alpha", type=float, default=0.05)
    reporting.add_argument(
        "--margin-fraction",
        type=float,
        default=MARGIN_FRACTION,
        help=f"the gated verdicts' margin as a fraction of grpo's gain over not training (default {MARGIN_FRACTION:g})",
    )
    reporting.add_argument("--prefix", default="rollouts_saved_", help="the plots' file name prefix")
    reporting.add_argument(
        "--pairs",
        default=f"{SKIPPER}:{RESAMPLER}",
        help=f"outcome (a)'s comparisons, as arm:baseline,... (default {SKIPPER}:{RESAMPLER})",
    )
    reporting.add_argument(
        "--baselines", default=BASELINE, help=f"outcome (b)'s baselines, comma-separated (default {BASELINE})"
    )
    args = parser.parse_args(argv)
    if args.command == "export":
        gains = _targets(args.gain) if args.gain else None
        rows = export(args.study, _targets(args.target) if args.target else None, gains=gains)
        write_text(args.csv, rows.to_csv(index=False))
        print(f"wrote {len(rows)} runs to {args.csv}")
    else:
        pairs = tuple(tuple(pair.split(":", 1)) for pair in args.pairs.split(",") if ":" in pair)
        if len(pairs) != len(args.pairs.split(",")):
            raise SystemExit(f"rollouts_saved_report: --pairs {args.pairs!r} is invalid: write arm:baseline,...")
        baselines = tuple(args.baselines.split(","))
        if not 0 < args.margin_fraction < 1:
            raise SystemExit(
                f"rollouts_saved_report: --margin-fraction {args.margin_fraction:g} is invalid: the margin is a "
                "fraction of grpo's gain, between 0 and 1 (for example 0.2)"
            )
        table = pd.read_csv(args.csv)
        print(report(table, args.out, args.margin, args.alpha, args.prefix, pairs, baselines, args.margin_fraction))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
