"""benchmarks/allocation_diagnostics.py, the per-level account of where the rollout allocator's rollouts went
(docs/results.md, beside the instrument study): a prompt's level from its text, the per-level table on
constructed records (shares of pilots and extensions, rollouts beyond G and the share near p = 1/2), and one tiny
real sandbox run: every candidate of every step recorded, each pilot either extended and trained or dropped
after its 2 rollouts, a pass rate for exactly the groups trained on."""

import numpy as np
import pandas as pd
import pytest
from helpers import load_benchmark


@pytest.fixture(scope="module")
def diagnostics():
    return load_benchmark("allocation_diagnostics")


def test_a_prompts_level_is_its_operands_digits_and_operator(diagnostics):
    assert [diagnostics.level_of(p) for p in ("3+4=", "12+7=", "12+70=", "12*7=")] == ["1+1", "2+1", "2+2", "2*1"]
    with pytest.raises(ValueError, match="not a sandbox prompt: '12-7='"):
        diagnostics.level_of("12-7=")


def test_the_level_table_counts_pilots_extensions_and_rollouts_beyond_g(diagnostics):
    records = pd.DataFrame(
        [  # level, rollouts, pilot, extended, trained, pass rate; G = 4
            ("1+1", 2, True, False, False, np.nan),  # a pilot that stayed collapsed
            ("1+1", 4, True, True, True, 0.25),  # a pilot extended to G
            ("2*1", 8, False, False, True, 0.5),  # 4 beyond G, near 1/2
            ("2*1", 6, False, False, True, 1.0),  # 2 beyond G, far from 1/2
        ],
        columns=["level", "rollouts", "pilot", "extended", "trained", "pass_rate"],
    )
    table = diagnostics.level_table(records, group_size=4, band=0.25)
    assert "| `1+1` | 2 | 1.000 | 0.500 | 0.250 | 0 | — | 6 |" in table
    assert "| `2*1` | 2 | 0.000 | — | — | 6 | 0.667 | 14 |" in table
    assert "| all | 4 | 0.500 | 0.500 | 0.250 | 6 | 0.667 | 20 |" in table


def test_a_real_run_records_every_candidate_and_its_rollouts(diagnostics, tmp_path):
    from verl_avspo.sandbox.config import PolicyConfig, SandboxConfig

    config = SandboxConfig(
        group_size=8, levels="1+1", steps=6, eval_every=6, eval_size=8, train_set=16, policy=PolicyConfig(sft_steps=20)
    )
    records, final = diagnostics.record(config, "grpo+alloc", 0, tmp_path / "cache")
    assert len(records) == 6 * 16 and records["level"].eq("1+1").all()
    assert 0 <= final <= 100
    # A barely warmed-up policy: pilots from step 2 on (as tests/sandbox's allocator test finds), each either
    # extended to G and trained, or dropped; the pass rate is known exactly for the groups trained on.
    pilots = records[records["pilot"]]
    assert len(pilots) and (pilots["trained"] == pilots["extended"]).all()
    assert records.loc[records["trained"], "pass_rate"].between(0, 1).all()
    assert records.loc[~records["trained"], "pass_rate"].isna().all()
    assert records.loc[pilots.index[~pilots["extended"]], "rollouts"].eq(2).all()
