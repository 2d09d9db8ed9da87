"""The TRL adapter's settings (``verl_avspo.trl.settings``) and what the trainer refuses at ``__init__``:
every bad ``estimator`` / ``avspo`` / ``acr`` value and every ``GRPOConfig`` option AVSPO cannot stand
in for, all in one message, before TRL loads the model; TRL's epsilon as AVSPO's default; the tested
TRL range is the package's ``trl`` extra, and another TRL, or none, is told at import. No model is
built here (the runs are tests/e2e/test_trl_cpu_e2e.py).
"""

import importlib
import sys
from pathlib import Path

import pytest
import tomllib

import verl_avspo

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

from trl import GRPOConfig  # noqa: E402

from verl_avspo.core.config import resolve_avspo  # noqa: E402
from verl_avspo.core.validation import SettingsError  # noqa: E402
from verl_avspo.trl import TESTED_TRL, AVSPOGRPOTrainer, resolve_trl_settings  # noqa: E402
from verl_avspo.trl.settings import TRL_EPSILON  # noqa: E402


def config(tmp_path, **options):
    return GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, **options)


def test_every_problem_is_refused_at_once_before_the_model_loads(tmp_path):
    args = config(tmp_path, scale_rewards="batch", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(SettingsError) as refused:
        # The model path does not exist: TRL would fail on it, so the settings are read first.
        AVSPOGRPOTrainer(
            model=str(tmp_path / "no-model"),
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            args=args,
            avspo={"preset": "papr", "tau": 0.5},
            acr={"tau": -1.0},
        )
    problems = refused.value.problems
    assert len(problems) == 5, problems
    expected = [
        "acr.tau=-1.0 is invalid: expected a number in (0.0, inf]",
        "avspo.tau=0.5 is ACR's setting, not AVSPO's: pass it as acr={'tau': 0.5}",
        "avspo.preset='papr' is invalid: allowed values are paper, paper_code, grpo, beta_loo, beta_fitted "
        "(did you mean 'paper'?)",
        "GRPOConfig.scale_rewards='batch' is invalid: with estimator='avspo'",
        "GRPOConfig.multi_objective_aggregation='normalize_then_sum' is invalid: AVSPO computes",
    ]
    for start in expected:
        assert any(problem.startswith(start) for problem in problems), (start, problems)


def test_the_estimator_is_checked_and_grpo_refuses_avspo_settings():
    with pytest.raises(SettingsError, match=r"estimator='avpso' is invalid: allowed values are grpo, avspo"):
        resolve_trl_settings("avpso")
    with pytest.raises(SettingsError, match=r"avspo=\{'preset': 'paper'\} was given with estimator='grpo'"):
        resolve_trl_settings("grpo", {"preset": "paper"})


def test_trls_advantages_take_every_grpoconfig_option(tmp_path):
    """estimator='grpo' keeps TRL's advantages, so batch scaling and normalize_then_sum are TRL's to run."""
    args = config(tmp_path, scale_rewards="batch", multi_objective_aggregation="normalize_then_sum")
    settings = resolve_trl_settings("grpo", None, {"alert": {"action": "stop"}}, args)
    assert settings.avspo is None and settings.acr.alert.action == "stop"


@pytest.mark.parametrize(("scale_rewards", "norm"), [("group", True), (True, True), ("none", False), (False, False)])
def test_scale_rewards_decides_the_std_division(tmp_path, scale_rewards, norm):
    assert resolve_trl_settings("avspo", args=config(tmp_path, scale_rewards=scale_rewards)).norm_adv_by_std is norm


def test_avspo_divides_by_std_plus_trls_epsilon_unless_told_otherwise():
    assert resolve_trl_settings("avspo").avspo.epsilon == TRL_EPSILON == 1e-4
    assert resolve_trl_settings("avspo", {"preset": "paper", "epsilon": 1e-6}).avspo.epsilon == 1e-6
    # A resolved AVSPOConfig is taken as it is, its epsilon included.
    given = resolve_avspo({"preset": "beta_loo"})
    assert resolve_trl_settings("avspo", given).avspo == given


def test_the_tested_trl_range_is_the_packages_trl_extra():
    with open(Path(verl_avspo.__file__).parents[1] / "pyproject.toml", "rb") as project:
        extras = tomllib.load(project)["project"]["optional-dependencies"]
    assert extras["trl"] == [f"trl{TESTED_TRL}"]


def reimport_adapter(monkeypatch):
    """Import ``verl_avspo.trl`` afresh (the test's changes to ``sys.modules`` are undone after it)."""
    for name in [name for name in sys.modules if name.startswith("verl_avspo.trl")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("verl_avspo.trl")


def test_an_untested_trl_gets_a_warning_on_import(monkeypatch):
    monkeypatch.setattr(sys.modules["trl"], "__version__", "1.17.0")
    with pytest.warns(UserWarning, match=r"tested with trl>=1.16,<1.17, and TRL 1.17.0 is installed"):
        reimport_adapter(monkeypatch)


def test_without_trl_the_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ImportError
    with pytest.raises(ImportError, match=r"verl_avspo.trl needs TRL .*pip install 'verl-avspo\[trl\]'"):
        reimport_adapter(monkeypatch)
