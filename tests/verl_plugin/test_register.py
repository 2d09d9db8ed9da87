"""The `avspo` estimator is reachable through verl's real registry and dispatch."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import group_uids, outcome_batch, outcome_data
from omegaconf import OmegaConf

from verl_avspo.verl_plugin import estimators, run_state

pytestmark = pytest.mark.verl

PROBE = (
    "import verl\n"
    "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
    "fn = get_adv_estimator_fn('avspo')\n"
    "print(fn.__module__)\n"
)


def _probe(env_overrides):
    env = {**os.environ, **env_overrides}
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)


def test_plain_import_verl_registers_avspo_via_entry_point():
    result = _probe({"VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "verl_avspo.verl_plugin.estimators"


def test_external_modules_fallback_registers_avspo():
    result = _probe(
        {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "verl_avspo.verl_plugin.register"}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "verl_avspo.verl_plugin.estimators"


def test_without_plugin_avspo_is_unknown():
    # The control for the two tests above: with plugins off, nothing registers avspo.
    result = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": ""})
    assert result.returncode != 0
    assert "Unknown advantage estimator" in result.stderr


def test_register_is_idempotent():
    from verl.trainer.ppo import core_algos

    from verl_avspo.verl_plugin import register

    register.register()
    register.register()
    assert core_algos.get_adv_estimator_fn("avspo") is estimators.compute_avspo_advantage
    # After a registry wipe (verl's own tests do this) registering again restores it.
    saved = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    try:
        core_algos.ADV_ESTIMATOR_REGISTRY.clear()
        register.register()
        assert core_algos.get_adv_estimator_fn("avspo") is estimators.compute_avspo_advantage
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.update(saved)


def test_a_foreign_avspo_registration_is_refused():
    from verl.trainer.ppo import core_algos

    from verl_avspo.verl_plugin import register

    saved = core_algos.ADV_ESTIMATOR_REGISTRY["avspo"]
    try:
        core_algos.ADV_ESTIMATOR_REGISTRY["avspo"] = lambda **kw: None
        with pytest.raises(ValueError, match="already been registered"):
            register.register()
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY["avspo"] = saved


def test_through_verl_compute_advantage_on_dataproto():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    run_state.reset()
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    rewards, mask = outcome_batch(scores, length=5)
    mask[0, 3:] = 0
    data = outcome_data(rewards, mask, group_uids([4, 4], "q"))
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "avspo": {"preset": "paper_code"}})
    out = compute_advantage(data, "avspo", config=config)
    adv = out.batch["advantages"]
    # q0 collapsed (all correct): one virtual 0 -> (1 - 4/5)/(std + 1e-4), near +1/sqrt(n+1) for n = 4.
    augmented = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    assert torch.allclose(adv[1:4, 0], (1 - augmented.mean()) / (augmented.std() + 1e-4), atol=1e-6)
    assert torch.all(adv[0, 3:] == 0)  # masked tokens stay zero
    # q1 is not collapsed: plain GRPO.
    q1 = scores[4:]
    expected = (q1 - q1.mean()) / (q1.std() + 1e-4)
    assert torch.allclose(adv[4:, 0], expected, atol=1e-6)
    assert torch.equal(out.batch["returns"], adv)
    # No host bound a run: verl's call started one in this process, which measured the batch.
    tracker = run_state.bound_tracker()
    metrics = tracker.end_step(1, adv)
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0 and metrics["avspo/triggered"] == 0.5
    # The next call is the same run's next step: one controller, carried by the bound tracker.
    compute_advantage(data, "avspo", config=config)
    assert run_state.bound_tracker() is tracker and tracker.controller.step == 2
    # Another setting is another run.
    compute_advantage(data, "avspo", config=OmegaConf.create({"avspo": {"preset": "paper"}}))
    assert run_state.bound_tracker() is not tracker


MODULES = "import sys, {imports}\nprint('\\n'.join(sorted(sys.modules)))\n"


def _modules(imports, plugins):
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": plugins, "VERL_USE_EXTERNAL_MODULES": ""}
    code = MODULES.format(imports=imports)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_entry_point_imports_nothing_beyond_core_algos():
    # The entry point runs in every verl process (vLLM and FSDP workers too): it may load
    # core_algos and our own framework-free core, nothing heavier (no trainer, Ray, pandas, ...).
    baseline = _modules("verl, verl.trainer.ppo.core_algos", plugins="none")
    with_plugin = _modules("verl", plugins="auto")
    extra = {m for m in with_plugin - baseline if not m.startswith("verl_avspo") and not m.startswith("__editable__")}
    assert extra == set()
    assert {"verl_avspo.verl_plugin.register", "verl_avspo.core.advantage"} <= with_plugin


HOOK = [
    "trainer.v1.sampler.custom_sampler.path=pkg://verl_avspo.verl_plugin.sampler",
    "trainer.v1.sampler.custom_sampler.name=ACRSampler",
]


def test_stock_main_ppo_refuses_the_hook_with_the_legacy_trainer():
    """verl's legacy trainer never builds the hook: stock main_ppo's process ends at `import verl`, before
    Hydra composes its config, naming the setting and the fix (verl's loader does not swallow SystemExit)."""
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *HOOK, "trainer.use_v1=False"],
        env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("verl-avspo: trainer.v1.sampler.custom_sampler (the ACR hook) is a V1 replay buffer, and ")
    assert "trainer.use_v1=False runs the legacy trainer" in last and "Set trainer.use_v1=True" in last
    assert "ray init kwargs" not in result.stdout  # stopped before verl's own run started


def test_only_stock_main_ppo_with_the_hook_and_the_legacy_trainer_is_refused():
    from verl_avspo.verl_plugin.hook_overrides import refuse_legacy_hook

    stock = "/env/lib/python3.12/site-packages/verl/trainer/main_ppo.py"
    with pytest.raises(SystemExit, match="trainer.use_v1=False runs the legacy trainer"):
        refuse_legacy_hook([stock, "++trainer.use_v1='false'", HOOK[1]])
    with pytest.raises(SystemExit, match="trainer.use_v1=False runs the legacy trainer"):  # while -m imports verl
        refuse_legacy_hook(["-m", HOOK[0], "trainer.use_v1=0"], ["python", "-u", "-m", "verl.trainer.main_ppo"])
    refuse_legacy_hook(["-m", *HOOK, "trainer.use_v1=False"], ["python", "-m", "verl_avspo.main_ppo"])  # launcher
    refuse_legacy_hook([stock, *HOOK, "trainer.use_v1=True"])  # the V1 trainer builds the hook
    refuse_legacy_hook([stock, "trainer.use_v1=False"])  # no hook: a legacy run as verl has it
    refuse_legacy_hook(["/env/bin/verl-avspo", "doctor", *HOOK, "trainer.use_v1=False"], [])  # doctor reports it
    refuse_legacy_hook(["/env/lib/python3.12/site-packages/ray/_private/workers/default_worker.py"])  # a worker
