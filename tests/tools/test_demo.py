"""``verl-avspo demo``: one synthetic batch through verl's own ``compute_advantage`` with grpo and
avspo. The printed table and metrics are read back and checked against GRPO's closed form, the
collapse counts and AVSPO's trigger rule; bad flags are refused with the values they got."""

import math
import re

import pytest

from verl_avspo import cli

pytestmark = pytest.mark.verl

ROW = re.compile(r"^\s*(\d+)\s+(\d+)/(\d+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)$")
METRIC = re.compile(r"^\s+(acr/\w+|avspo/\w+)\s+(-?\d+\.\d+)$")


def _demo(capsys, *flags: str) -> tuple[list[tuple[int, int, float, float]], dict[str, float]]:
    """The demo's rows (correct, group size, first grpo advantage, first avspo advantage) and metrics."""
    assert cli.main(["demo", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ROW.match(line) for line in lines]
    table = [(int(m[2]), int(m[3]), float(m[4]), float(m[5])) for m in rows if m]
    metrics = {m[1]: float(m[2]) for m in map(METRIC.match, lines) if m}
    return table, metrics


def _grpo_magnitudes(correct: int, size: int) -> tuple[float, float]:
    """|advantage| of a correct and of a wrong response in a mixed group: (r − p) / s with verl's
    unbiased std s = sqrt(G/(G−1)·p(1−p)) and p = correct/G."""
    p = correct / size
    std = math.sqrt(size / (size - 1) * p * (1 - p))
    return (1 - p) / std, p / std


# The default batch (8 x 8, all-wrong and mixed groups) and one with all-correct groups too.
@pytest.mark.parametrize("flags", [(), ("--groups", "12", "--group-size", "4", "--seed", "3")])
def test_paper_preset_gives_collapsed_groups_an_advantage_and_leaves_mixed_ones_to_grpo(capsys, flags):
    table, metrics = _demo(capsys, *flags)
    groups = 12 if flags else 8
    assert len(table) == groups
    all_wrong = sum(correct == 0 for correct, *_ in table)
    all_correct = sum(correct == size for correct, size, *_ in table)
    assert metrics["acr/all_wrong"] == pytest.approx(all_wrong / groups, abs=5e-4)
    assert metrics["acr/all_correct"] == pytest.approx(all_correct / groups, abs=5e-4)
    assert metrics["acr/rate"] == pytest.approx((all_wrong + all_correct) / groups, abs=5e-4)
    # Both batches collapse in more than half their groups, above the paper's θ_1 = 0.5: AVSPO fires,
    # augments every collapsed group and leaves none at zero advantage.
    assert metrics["avspo/threshold"] == 0.5 and metrics["acr/rate"] > 0.5
    assert metrics["avspo/triggered"] == pytest.approx(metrics["acr/rate"], abs=5e-4)
    assert metrics["acr/effective"] == 0.0
    for correct, size, grpo, avspo in table:
        if 0 < correct < size:
            assert avspo == grpo  # a mixed group is GRPO's
            assert min(abs(abs(grpo) - m) for m in _grpo_magnitudes(correct, size)) < 1e-4
        else:
            assert grpo == 0.0  # collapsed: no GRPO signal
            assert avspo < 0 if correct == 0 else avspo > 0  # all wrong pushed down, all correct up


def test_grpo_preset_is_grpo(capsys):
    table, metrics = _demo(capsys, "--preset", "grpo")
    assert all(avspo == grpo for _, _, grpo, avspo in table)
    assert metrics["avspo/triggered"] == 0.0 and metrics["acr/effective"] == metrics["acr/rate"] > 0


@pytest.mark.parametrize(("flags", "got"), [(("--groups", "0"), "got 0 and 8"), (("--group-size", "1"), "got 8 and 1")])
def test_bad_sizes_are_refused_with_what_they_got(flags, got):
    with pytest.raises(SystemExit, match=rf"--groups must be at least 1 and --group-size at least 2 .*; {got}"):
        cli.main(["demo", *flags])
