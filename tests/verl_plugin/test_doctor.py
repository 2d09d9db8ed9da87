"""``verl-avspo doctor`` reports each link of the plugin chain and fails loudly on a broken one;
TRL, where it is installed (its verdict on verl next to TRLs with and without the value-head class
is tested with the guard, in tests/verl_plugin/test_trl_guard.py)."""

import argparse
import importlib.metadata
import importlib.util
import sys

import pytest

from verl_avspo.verl_plugin import doctor

pytestmark = pytest.mark.verl


@pytest.mark.ray
def test_doctor_passes_on_this_install_including_a_ray_actor(capsys):
    assert doctor.run(argparse.Namespace(no_ray=False)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[ok]   versions: verl 0.9.1, torch ") and " ray " in out[0]
    assert out[1].startswith("[ok]   entry point: verl_avspo.verl_plugin.register loads")
    assert out[2] == "[ok]   fresh `import verl`: registered by verl_avspo.verl_plugin.estimators"
    assert out[3] == "[ok]   Ray actor: registered by verl_avspo.verl_plugin.estimators (in a Ray actor)"
    assert out[4].startswith("[ok]   launcher config: ") and "adv_estimator=avspo, preset=paper" in out[4]
    assert out[5] == (
        "[ok]   baselines: dcpo estimator and policy loss registered; RENT needs no patch; INTUITOR needs "
        "patches/verl-0.9.1-intrinsic.patch, not applied to this verl"
    )
    assert out[6] == (
        "[ok]   stock main_ppo trainer: ACR in stock `python -m verl.trainer.main_ppo` (V1): add "
        "trainer.v1.trainer_mode=avspo_sync (or avspo_colocate_async, avspo_separate_async)"
    )
    assert out[7].startswith("[ok]   TRL: ")
    assert out[-1] == "all checks passed"


def test_doctor_fails_when_verl_processes_do_not_load_the_plugin(capsys, monkeypatch):
    # What a worker sees when plugin loading is off (or the entry point is missing there).
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    assert doctor.run(argparse.Namespace(no_ray=True)) == 1
    out = capsys.readouterr().out
    assert "[FAIL] fresh `import verl`: RuntimeError: not registered" in out
    assert "VERL_USE_EXTERNAL_PLUGINS=none tells verl not to load the `avspo` entry point (no plugin at all)" in out
    assert "Ray actor" not in out
    assert out.splitlines()[-1] == "1 check(s) failed"


def test_doctor_names_the_plugin_policy_that_excludes_avspo(monkeypatch):
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    for policy, blamed in (("none", True), ("other_plugin", True), ("auto", False), ("avspo,other", False)):
        monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", policy)
        assert (doctor._plugin_policy_problem() is not None) is blamed, policy
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "verl_avspo.verl_plugin.register")
    assert doctor._plugin_policy_problem() is None


def test_doctor_reports_a_patched_verl_and_a_foreign_dcpo_loss(capsys, monkeypatch):
    from verl.trainer.ppo import core_algos

    monkeypatch.setattr("verl_avspo.verl_plugin.checks.resources.verl_has_self_certainty", lambda: True)
    assert doctor._baselines().endswith("INTUITOR verl carries patches/verl-0.9.1-intrinsic.patch")
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "dcpo", len)
    assert doctor.run(argparse.Namespace(no_ray=True)) == 1
    assert "[FAIL] baselines: RuntimeError: the 'dcpo' loss is registered by builtins" in capsys.readouterr().out


# What every stock main_ppo command line names (verl's config requires it).
ENGINE = "actor_rollout_ref.rollout.name=vllm"


def test_doctor_imports_what_the_given_overrides_name(capsys):
    """Overrides as a user typed them for stock main_ppo: a misspelt class they name fails the doctor."""
    path = "data.custom_cls.path=pkg://json"
    assert doctor._stock_route([ENGINE, path, "data.custom_cls.name=JSONDecoder", "trainer.nnodes=1"]).endswith(
        "your overrides compose with verl's config and pass verl-avspo's checks"
    )
    args = argparse.Namespace(no_ray=True, overrides=[ENGINE, path, "data.custom_cls.name=JSONDecodr"])
    assert doctor.run(args) == 1
    out = capsys.readouterr().out
    assert "[FAIL] stock main_ppo trainer: RuntimeError: data.custom_cls.name=JSONDecodr" in out
    assert "Did you mean data.custom_cls.name=JSONDecoder?" in out


def test_doctor_fails_our_mode_with_the_legacy_trainer():
    """Our mode with trainer.use_v1=False: verl's legacy trainer never reads it, so the doctor fails, naming the
    setting and the fix (the overrides alone, where the mode is the one to add, or with our mode named)."""
    for overrides in (["trainer.use_v1=False"], ["trainer.v1.trainer_mode=avspo_colocate_async", "trainer.use_v1=0"]):
        with pytest.raises(RuntimeError) as failed:
            doctor._stock_route([ENGINE, *overrides])
        assert "is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer" in str(failed.value)
        assert "Set trainer.use_v1=True." in str(failed.value)
    assert doctor._stock_route([ENGINE, "trainer.use_v1=True"]).startswith("ACR in stock")
    # verl's own mode with the legacy trainer is no trainer of ours: nothing to refuse.
    assert doctor._stock_route([ENGINE, "trainer.use_v1=False", "trainer.v1.trainer_mode=sync"]).startswith("ACR")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # A misspelt mode of ours: the doctor said "[ok] ... add trainer.v1.trainer_mode=avspo_sync".
        (
            ["trainer.v1.trainer_mode=avspo_synk"],
            "trainer.v1.trainer_mode=avspo_synk is none of verl-avspo's trainers. Did you mean "
            "trainer.v1.trainer_mode=avspo_sync?",
        ),
        (
            ["trainer.v1.trainer_mode=snyc"],
            "trainer.v1.trainer_mode='snyc' is not a registered V1 trainer. Did you mean 'sync'?",
        ),
        # Our keys without +, which stock main_ppo's Hydra refuses.
        (
            ["algorithm.prompts.allocation.enable=True", "algorithm.avspo.preset=paper"],
            "algorithm.prompts.allocation.enable=True algorithm.avspo.preset=paper: stock main_ppo's config (verl's "
            "ppo_trainer) has no algorithm.avspo, algorithm.prompts, so Hydra would refuse them before training. "
            "Write them with a +: +algorithm.prompts.allocation.enable=True +algorithm.avspo.preset=paper",
        ),
        # A bad value of ours.
        (
            [
                "trainer.v1.trainer_mode=avspo_sync",
                "+algorithm.prompts.allocation.enable=True",
                "+algorithm.prompts.allocation.budget_share=0",
            ],
            "algorithm.prompts.allocation.budget_share=0 is invalid: expected a finite number > 0.0.",
        ),
        # The allocator on stock main_ppo without our trainer mode: verl's own trainer would ignore it.
        (
            [
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=8",
                "+algorithm.prompts.allocation.enable=True",
            ],
            "algorithm.prompts.allocation.enable=True, but no verl-avspo trainer runs in this process",
        ),
        # Another override stock main_ppo's Hydra refuses.
        (["trainer.save_freqq=1"], "stock main_ppo's Hydra would refuse these overrides: Could not override"),
    ],
)
def test_doctor_checks_the_stock_overrides_as_the_launcher_checks_a_config(overrides, message, capsys):
    """Each used to pass with "all checks passed", and failed later in the run (a typo of our mode after 44 s in a
    Ray traceback)."""
    assert doctor.run(argparse.Namespace(no_ray=True, overrides=[ENGINE, *overrides])) == 1
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("[FAIL] stock main_ppo trainer")]
    assert message in line


def test_doctor_refuses_a_torn_run_state_that_stock_main_ppo_would_resume_from(tmp_path):
    from omegaconf import OmegaConf

    from verl_avspo.verl_plugin.run_state import start_run

    for step in (1, 2):
        (tmp_path / f"global_step_{step}").mkdir()
    start_run(OmegaConf.create({"adv_estimator": "grpo"})).save(tmp_path / "global_step_1")
    (tmp_path / "global_step_2" / "avspo_state.pt").write_bytes(b"torn")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    with pytest.raises(RuntimeError) as failed:
        doctor._stock_route([ENGINE, f"trainer.default_local_dir={tmp_path}"])
    assert f"trainer.resume_mode=auto resumes from {tmp_path}/global_step_2, but" in str(failed.value)
    assert f"add trainer.resume_mode=resume_path trainer.resume_from_path={tmp_path}/global_step_1" in str(failed.value)


def test_doctor_says_when_trl_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # importlib.util.find_spec("trl") is None
    assert doctor._trl().startswith("not installed (pip install 'verl-avspo[trl]'")


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed (pip install -e '.[trl]')")
def test_doctor_reports_the_installed_trl():
    # make setup installs a TRL in the adapter's tested range.
    version = importlib.metadata.version("trl")
    said = doctor._trl()
    assert said.startswith(f"trl {version} (tested); GRPOTrainer and verl_avspo.trl.AVSPOGRPOTrainer import; ")
    assert said.partition("verl and TRL's value-head class: ")[2].startswith(("TRL has none", "TRL has it", "verl"))
