"""The statistics over seeds (tools.seed_stats): mean ± sample std cells, paired differences with their
standard error, and the one-sided paired t-test the sandbox's verdicts and the studies share, against
closed forms and invariances."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.tools.seed_stats import (
    ALPHA,
    PairedDifference,
    mean_std,
    mean_std_cell,
    one_sided_t,
    paired_difference,
    paired_t,
    student_t_sf,
)


def test_mean_std_is_the_mean_and_the_sample_std_over_seeds():
    mean, std = mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and std == pytest.approx(math.sqrt(5 / 3))  # sum of squares 5 over n - 1 = 3, not n
    means, stds = mean_std([[1.0, 10.0], [3.0, 14.0]])  # (seeds, points): over seeds, per point
    assert means.tolist() == [2.0, 12.0] and stds == pytest.approx([math.sqrt(2), math.sqrt(8)])


def test_mean_std_cell_formats_mean_and_sample_std():
    assert mean_std_cell([1.0, 2.0, 3.0, 4.0], 3) == "2.500 ± 1.291"  # population std would be 1.118
    assert mean_std_cell([0.5, 0.7], 1, scale=100) == "60.0 ± 14.1"  # 100 * sqrt(0.02)
    assert mean_std_cell(np.array([127.0, 129.0]), 0) == "128 ± 1"
    assert mean_std_cell([0.25], 3) == "0.250"  # a single seed has no spread to show
    assert mean_std_cell([0.25, math.nan], 3) == "n/a"


def test_paired_difference_is_the_mean_and_standard_error_over_seeds():
    difference = paired_difference([-1.0, 0.0, 2.0, 3.0])
    # mean 1; sample variance (4 + 1 + 1 + 4) / 3; s.e. = std / sqrt(4); a zero is not "higher"
    assert difference == PairedDifference(1.0, pytest.approx(math.sqrt(10 / 3) / 2), 2, 4)
    assert difference.cell(1) == "+1.0 ± 0.9" and difference.cell(2) == "+1.00 ± 0.91"
    assert paired_difference(np.array([1.0, 2.0, 3.0, 4.0, 5.0])).standard_error == pytest.approx(math.sqrt(0.5))
    assert paired_difference([-2.0, -4.0]).cell(1) == "-3.0 ± 1.0"


def test_paired_difference_moves_with_a_shift_and_scales_with_the_differences():
    differences = np.random.default_rng(0).normal(size=7)
    base, shifted, scaled = (paired_difference(d) for d in (differences, differences + 5, 3 * differences))
    assert shifted.mean == pytest.approx(base.mean + 5) and shifted.standard_error == pytest.approx(base.standard_error)
    assert scaled.mean == pytest.approx(3 * base.mean) and scaled.standard_error == pytest.approx(
        3 * base.standard_error
    )


def test_paired_difference_of_a_single_seed_has_no_standard_error():
    with pytest.warns(RuntimeWarning):  # numpy: a std over one value has zero degrees of freedom
        difference = paired_difference([2.0])
    assert difference.mean == 2.0 and math.isnan(difference.standard_error) and difference.seeds == 1
    assert difference.cell(1) == "+2.0"  # no spread to show, not "+2.0 ± nan"


def test_paired_difference_without_a_seed_in_common_is_not_available():
    difference = paired_difference([])
    assert difference.seeds == 0 and math.isnan(difference.mean) and difference.cell(1) == "n/a"


def test_t_distribution_matches_known_quantiles():
    assert student_t_sf(2.093024, 19) == pytest.approx(0.025, abs=1e-6)  # t_{0.975, 19}
    assert student_t_sf(1.0, 1) == pytest.approx(0.25)  # Cauchy: 1/2 - atan(1)/pi
    assert student_t_sf(0.0, 7) == pytest.approx(0.5)
    assert student_t_sf(-1.5, 4) == pytest.approx(1 - student_t_sf(1.5, 4))


def test_paired_t_closed_form():
    result = paired_t(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert result["mean"] == 3.0 and result["se"] == pytest.approx(math.sqrt(2.5 / 5))
    assert result["t"] == pytest.approx(3.0 / math.sqrt(0.5))
    half = 2.776445 * math.sqrt(0.5)  # t_{0.975, 4}
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((3 - half, 3 + half), abs=1e-5)
    assert paired_t(np.array([-1.0, -2.0, -3.0]))["p"] > 0.9  # one-sided: a loss is no evidence
    # The verdicts' p without the interval is paired_t's.
    assert one_sided_t(paired_difference([1.0, 2.0, 3.0, 4.0, 5.0])) == (result["t"], result["p"])
    assert one_sided_t(paired_difference([2.0, 2.0])) == (math.inf, 0.0)  # no spread, all above: certain


def test_a_paired_t_test_at_alpha_is_stricter_than_twice_the_standard_error_on_few_seeds():
    gains = np.array([1.0, 2.0, 4.0])  # 2.65 standard errors above 0
    result = paired_t(gains)
    assert result["t"] == pytest.approx(math.sqrt(7))
    assert result["p"] > ALPHA and result["mean"] > 2 * result["se"]


@settings(deadline=None, max_examples=25)  # each test bisects the t quantile through mpmath
@given(
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=2, max_size=12).filter(lambda d: np.std(d) > 1e-3),
    st.floats(0.1, 10),
)
def test_the_paired_t_test_does_not_depend_on_the_unit(differences, scale):
    """Rescaling every difference (points to fractions) changes neither t nor p, and scales the interval."""
    plain, scaled = paired_t(np.array(differences)), paired_t(scale * np.array(differences))
    assert scaled["t"] == pytest.approx(plain["t"], rel=1e-6)
    assert scaled["p"] == pytest.approx(plain["p"], rel=1e-6, abs=1e-12)
    assert scaled["ci_low"] == pytest.approx(scale * plain["ci_low"], rel=1e-6, abs=1e-9)
