"""What a log says about collapse and its causes (``verl_avspo.tools.signals``): the collapse source
taken from whatever the log holds, in order, each labelled; a row logged every N steps spread over its
N steps; the reward's trend (first vs last fifth, Mann-Kendall over the run and its last third); the
causes: truncation by its share, reward functions never earned or saturated, PPO's clip fraction."""

import numpy as np
import pandas as pd
import pytest

from verl_avspo.tools.collapse_measures import collapse_rate
from verl_avspo.tools.signals import causes, per_step, trend


def frame(**columns) -> pd.DataFrame:
    length = len(next(iter(columns.values())))
    return pd.DataFrame(columns, index=pd.Index(range(1, length + 1), name="step"))


def test_collapse_is_read_from_the_first_source_the_log_holds():
    both = frame(**{"acr/rate": [0.5, 0.5], "frac_reward_zero_std": [0.1, 0.1], "reward_std": [0.0, 0.0]})
    assert collapse_rate(both).source == "acr/rate"
    assert collapse_rate(both, usable={"frac_reward_zero_std", "reward_std"}).source == "frac_reward_zero_std"
    older = frame(reward_std=[0.0, 0.2, 0.0], reward=[0.0, 0.5, 1.0], completion_length=[10.0, 10.0, 10.0])
    spread = collapse_rate(older)
    assert spread.source == "reward_std == 0" and spread.lower_bound and "older TRL" in spread.what
    assert spread.rate.tolist() == [1.0, 0.0, 1.0] and spread.all_wrong.tolist() == [1.0, 0.0, 0.0]
    openrlhf = collapse_rate(frame(**{"train/group_reward_std": [0.0, 0.3]}))
    assert openrlhf.source == "train/group_reward_std == 0" and "OpenRLHF" in openrlhf.what
    verl = frame(**{"critic/score/max": [0.0, 1.0, 1.0], "critic/score/min": [0.0, 0.0, 1.0]})
    scores = collapse_rate(verl)
    assert scores.rate.tolist() == [1.0, 0.0, 1.0]
    assert scores.all_wrong.tolist() == [1.0, 0.0, 0.0] and scores.all_correct.tolist() == [0.0, 0.0, 1.0]
    assert collapse_rate(frame(loss=[1.0])) is None


def test_a_row_logged_every_n_steps_stands_for_its_n_steps():
    rows = pd.DataFrame({"x": [1.0, 2.0]}, index=pd.Index([5, 10], name="step"))
    expanded = per_step(rows, 5)
    assert expanded.index.tolist() == list(range(1, 11)) and expanded["x"].tolist() == [1.0] * 5 + [2.0] * 5


def test_trend_final_is_the_last_fifth_and_a_stopped_rise_is_told():
    rising = pd.Series(np.linspace(0, 1, 50), index=range(1, 51))
    up = trend(rising)
    assert up.direction == "rose" and not up.stopped
    assert up.final == pytest.approx(rising.iloc[-10:].mean()) and up.last == 1.0
    plateau = pd.Series(np.r_[np.linspace(0, 1, 30), np.tile([0.9, 1.0], 15)], index=range(1, 61))
    stopped = trend(plateau)
    assert stopped.direction == "rose" and stopped.stopped and stopped.recent_from == 41
    assert trend(pd.Series([0.5, 0.4, 0.5, 0.4] * 10)).direction == "flat"
    assert trend(pd.Series([0.5])).final == 0.5 and trend(pd.Series([], dtype=float)) is None


def test_causes_truncation_by_share_and_constant_reward_functions():
    cut = frame(**{"completions/clipped_ratio": [0.02] * 4 + [1.0] * 16})
    (truncation,) = causes(cut, pd.Series(1.0, index=cut.index))
    assert truncation.kind == "truncation" and truncation.severity == "ALERT"
    assert any("rose from 0.02 to 1.00 at step 5" in line for line in truncation.evidence)
    assert causes(frame(**{"completions/clipped_ratio": [0.01] * 10}), pd.Series(dtype=float)) == []
    functions = frame(
        **{
            "rewards/format/mean": [1.0] * 10,
            "rewards/format/std": [0.0] * 10,
            "rewards/answer": [0.0] * 10,  # older TRL: no std
            "rewards/useful/mean": list(np.linspace(0, 1, 10)),
            "rewards/useful/std": [0.3] * 10,
        }
    )
    found = {cause.kind: cause for cause in causes(functions, pd.Series(dtype=float))}
    assert set(found) == {"saturated", "never_rewarded"}
    assert "format" in found["saturated"].headline and "answer" in found["never_rewarded"].headline
    clip = frame(**{"actor/pg_clipfrac": [0.01, 0.47]})
    assert causes(clip, pd.Series(dtype=float))[0].kind == "clip"
