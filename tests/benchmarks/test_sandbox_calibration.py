"""benchmarks/sandbox_calibration.py, the sandbox's calibration (docs/sandbox_calibration.md): each named
setting means what it meant when its rows were run, whatever today's defaults are (every default a
calibration changed is pinned), each row ran its setting's steps, and the page's table is what ``report``
prints from the committed CSV."""

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from helpers import load_benchmark

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def calibration():
    return load_benchmark("sandbox_calibration")


def test_a_setting_does_not_follow_the_defaults(calibration, monkeypatch):
    """Other defaults for every field a calibration changed leave every named setting as it was."""
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig

    before = {name: calibration.config_of(name) for name in calibration.SETTINGS}
    changed = replace(
        SandboxConfig(),
        steps=999,
        group_size=4,
        eval_size=7,
        eval_every=3,
        lr_warmup_steps_ratio=0.9,
        policy=replace(PolicyConfig(), sft_steps=1),
    )
    monkeypatch.setattr(calibration, "SandboxConfig", lambda: changed)
    assert {name: calibration.config_of(name) for name in calibration.SETTINGS} == before
    assert before["demo_disjoint_150"].policy.sft_steps == 1000  # the warm-up before the second calibration
    assert before["sft700_g16_300"].lr_warmup_steps == 0  # the constant rate before the third
    assert calibration.config_of("defaults") == changed  # today's defaults do follow them


def test_each_row_ran_its_settings_steps(calibration):
    rows = pd.read_csv(calibration.CSV)
    assert set(rows["setting"]) <= set(calibration.SETTINGS) | set(calibration.AT_DEFAULTS)
    for name, runs in rows.groupby("setting"):
        assert set(runs["steps"]) == {calibration.config_of(name).steps}, name


def test_the_page_table_is_what_report_prints(calibration):
    page = (ROOT / "docs" / "sandbox_calibration.md").read_text()
    assert calibration.report(calibration.CSV) in page
