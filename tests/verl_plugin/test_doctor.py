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


def test_doctor_imports_what_the_given_overrides_name(capsys):
    """Overrides as a user typed them for stock main_ppo: a misspelt class they name fails the doctor."""
    path = "data.custom_cls.path=pkg://json"
    assert doctor._stock_route([path, "data.custom_cls.name=JSONDecoder", "trainer.nnodes=1"]).endswith(
        "data.custom_cls.path=pkg://json data.custom_cls.name=JSONDecoder import(s) as verl will import them"
    )
    args = argparse.Namespace(no_ray=True, overrides=[path, "+data.custom_cls.name=JSONDecodr"])
    assert doctor.run(args) == 1
    out = capsys.readouterr().out
    assert "[FAIL] stock main_ppo trainer: RuntimeError: data.custom_cls.name=JSONDecodr" in out
    assert "Did you mean data.custom_cls.name=JSONDecoder?" in out


def test_doctor_fails_our_mode_with_the_legacy_trainer():
    """Our mode with trainer.use_v1=False: verl's legacy trainer never reads it, so the doctor fails, naming the
    setting and the fix (the overrides alone, where the mode is the one to add, or with our mode named)."""
    for overrides in (["trainer.use_v1=False"], ["trainer.v1.trainer_mode=avspo_colocate_async", "trainer.use_v1=0"]):
        with pytest.raises(RuntimeError) as failed:
            doctor._stock_route(overrides)
        assert "is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer" in str(failed.value)
        assert str(failed.value).endswith("Set trainer.use_v1=True.")
    assert doctor._stock_route(["trainer.use_v1=True"]).startswith("ACR in stock")
    # verl's own mode with the legacy trainer is no trainer of ours: nothing to refuse.
    assert doctor._stock_route(["trainer.use_v1=False", "trainer.v1.trainer_mode=sync"]).startswith("ACR in stock")


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
