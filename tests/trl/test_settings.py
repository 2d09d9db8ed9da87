"""The TRL adapter's settings (``verl_avspo.trl.settings``) and what the trainer refuses at ``__init__``:
every bad ``estimator`` / ``avspo`` / ``acr`` value and every ``GRPOConfig`` option AVSPO cannot stand
in for, all in one message, before TRL loads the model; the ``GRPOConfig`` values TRL itself checks
only at the first step; ``avspo``'s allowed keys without ACR's; the core's ``tau`` check in TRL's
spelling; the warning for checkpoints inside a generation; a class with the mixin behind
``GRPOTrainer``, refused when defined; TRL's epsilon as AVSPO's default; the tested TRL range is the
package's ``trl`` extra, and another TRL, or none, is told at import. No model is built here (the
runs are tests/trl/test_trainer.py and tests/e2e/test_trl_cpu_e2e.py).
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
        "acr.tau=-1.0 is invalid: expected a finite number > 0.0",
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


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("scale_rewards", "grop", "allowed values are group, batch, none (did you mean 'group'?)"),
        (
            "loss_type",
            "dapoo",
            "allowed values are grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo (did you mean 'dapo'?)",
        ),
        ("multi_objective_aggregation", "sum_then_norm", "(did you mean 'sum_then_normalize'?)"),
    ],
)
@pytest.mark.parametrize("estimator", ["avspo", "grpo"])
def test_grpoconfig_values_trl_checks_only_at_the_first_step_are_refused_at_init(
    tmp_path, estimator, option, value, expected
):
    args = config(tmp_path, **{option: value})  # GRPOConfig takes them
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings(estimator, args=args)
    (message,) = refused.value.problems
    assert message.startswith(f"GRPOConfig.{option}={value!r} is invalid: allowed values are ") and expected in message


def test_avspos_allowed_keys_are_only_those_it_takes_and_acrs_are_pointed_to_acr():
    with pytest.raises(SettingsError) as refused:
        resolve_trl_settings("avspo", {"gapp": 0.2, "alert": {"window": 3}})
    misplaced, unknown = sorted(refused.value.problems)
    assert misplaced.startswith("avspo.alert={'window': 3} is ACR's setting, not AVSPO's: pass it as acr=")
    assert unknown.startswith("avspo.gapp is not a setting. Did you mean avspo.gap? Allowed keys of avspo: preset, ")
    allowed = unknown.split("Allowed keys of avspo: ")[1].split(". (")[0].split(", ")
    assert "gap" in allowed and not {"tau", "reward_range", "alert"} & set(allowed)
    assert unknown.endswith("(ACR's tau, reward_range and alert are acr=.)")


def test_the_cores_tau_check_names_trls_argument():
    with pytest.raises(SettingsError, match=r"^acr.tau=5.0 is invalid: a group's scores within reward_range"):
        resolve_trl_settings("grpo", acr={"tau": 5})
    with pytest.warns(UserWarning, match=r"^acr.tau=0.2 is 20% of reward_range"):
        resolve_trl_settings("grpo", acr={"tau": 0.2})


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        ({"save_steps": 3, "steps_per_generation": 2}, "Set save_steps to a multiple of 2"),
        ({"save_steps": 2, "steps_per_generation": 2, "num_iterations": 2}, "Set save_steps to a multiple of 4"),
        ({"save_steps": 1, "gradient_accumulation_steps": 2, "steps_per_generation": 4}, "a multiple of 2"),
        ({"save_steps": 4, "steps_per_generation": 2}, None),
        ({"save_steps": 3, "steps_per_generation": 2, "save_strategy": "no"}, None),
        ({"save_steps": 0.5, "steps_per_generation": 2}, None),  # a fraction of max_steps: not known yet
    ],
)
def test_checkpoints_inside_a_generation_are_warned_of_at_init(tmp_path, options, warned, recwarn):
    resolve_trl_settings("grpo", args=config(tmp_path, per_device_train_batch_size=8, **options))
    messages = [str(warning.message) for warning in recwarn if "GRPOConfig.save_steps" in str(warning.message)]
    if warned is None:
        assert messages == []
    else:
        (message,) = messages
        assert message.startswith(f"GRPOConfig.save_steps={options['save_steps']} (x gradient_accumulation_steps=")
        assert "does not resume exactly" in message and warned in message


def test_a_class_with_the_mixin_behind_grpotrainer_is_refused_when_defined():
    from trl import GRPOTrainer

    from verl_avspo.trl import ACRTrainerMixin

    wrong_order = r"class Wrong puts ACRTrainerMixin behind GRPOTrainer .* class Wrong\(ACRTrainerMixin, "
    with pytest.raises(TypeError, match=wrong_order):
        type("Wrong", (GRPOTrainer, ACRTrainerMixin), {})
    subclass = type("MyGRPOTrainer", (GRPOTrainer,), {})
    with pytest.raises(TypeError, match=r"Put ACRTrainerMixin before GRPOTrainer"):
        type("AlsoWrong", (subclass, ACRTrainerMixin), {})
    # In front, with classes before it or between it and GRPOTrainer (the e2e harness's recorders): accepted.
    before, between = type("Before", (), {}), type("Between", (), {})
    type("Right", (before, ACRTrainerMixin, between, subclass), {})
