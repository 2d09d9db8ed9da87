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


def test_a_foreign_dcpo_loss_is_refused_and_left_in_place():
    """verl's register_policy_loss replaces a name silently: we ask verl's getter first and never overwrite."""
    from verl.trainer.ppo import core_algos

    from verl_avspo.verl_plugin import register

    saved = core_algos.get_policy_loss_fn("dcpo")
    try:
        core_algos.POLICY_LOSS_REGISTRY["dcpo"] = len
        with pytest.raises(ValueError, match="policy loss 'dcpo' is already registered by builtins"):
            register.register()
        assert core_algos.get_policy_loss_fn("dcpo") is len
    finally:
        core_algos.POLICY_LOSS_REGISTRY["dcpo"] = saved


RELOAD = """
import importlib, sys
import verl
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import trainer_base
from verl_avspo.verl_plugin import estimators, register, dcpo_loss, trainer_v1

writes = []
for registry in (core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY, trainer_base.TRAINER_REGISTRY):
    class Watched(dict):
        def __setitem__(self, key, value, _w=writes):
            _w.append(key); dict.__setitem__(self, key, value)
        def __delitem__(self, key, _w=writes):
            _w.append("del " + key); dict.__delitem__(self, key)
    watched = Watched(registry)
    for module, name in ((core_algos, "ADV_ESTIMATOR_REGISTRY"), (core_algos, "POLICY_LOSS_REGISTRY"),
                         (trainer_base, "TRAINER_REGISTRY")):
        if getattr(module, name) is registry:
            setattr(module, name, watched)
before = (core_algos.get_adv_estimator_fn("avspo"), core_algos.get_policy_loss_fn("dcpo"),
          trainer_base.get_trainer_cls("avspo_sync"))
old_class = trainer_v1.AVSPOTrainerSync
for module in (estimators, dcpo_loss, register, trainer_v1):
    importlib.reload(module)
register.register()
after = (core_algos.get_adv_estimator_fn("avspo"), core_algos.get_policy_loss_fn("dcpo"),
         trainer_base.get_trainer_cls("avspo_sync"))
print(writes, all(a is b for a, b in zip(before, after)), trainer_v1.AVSPOTrainerSync is not old_class,
      trainer_v1.V1_TRAINERS["avspo_sync"] is old_class)
"""


def test_a_reload_registers_nothing_again_and_deletes_nothing():
    """Our modules reloaded (new function and class objects): verl's three registries are neither written nor
    deleted from (each registry watched), and still hold this process's first registrations."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""}
    result = subprocess.run([sys.executable, "-c", RELOAD], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[] True True True"


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
    # No trainer of ours ran the stage: verl's call started this process's fallback, which measured the batch.
    tracker = run_state.tracker_for(config, "avspo")
    metrics = tracker.end_step(1, adv)
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0 and metrics["avspo/triggered"] == 0.5
    # The next call is the same run's next step: one controller, carried by the fallback tracker.
    compute_advantage(data, "avspo", config=config)
    assert run_state.tracker_for(config, "avspo") is tracker and tracker.controller.step == 2
    # Another setting is another run.
    other = OmegaConf.create({"avspo": {"preset": "paper"}})
    compute_advantage(data, "avspo", config=other)
    assert run_state.tracker_for(other, "avspo") is not tracker


def test_a_trainers_tracker_is_served_to_the_estimator_called_with_its_config():
    """The one way from our trainer to the estimator's state: start_run serves its tracker to verl's calls with that
    very config.algorithm node; a call with another node, even an equal one, takes the bare-estimator route."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    run_state.reset()
    config = OmegaConf.create(
        {"adv_estimator": "avspo", "norm_adv_by_std_in_grpo": True, "avspo": {"preset": "paper_code"}}
    )
    data = outcome_data(*outcome_batch(torch.tensor([1.0, 1.0, 0.0, 1.0]), length=2), group_uids([2, 2], "q"))
    trainer_tracker = run_state.start_run(config)
    compute_advantage(data, "avspo", config=config)
    compute_advantage(data, "avspo", config=config)
    assert trainer_tracker.controller.step == 2
    equal = OmegaConf.create(OmegaConf.to_container(config))
    compute_advantage(data, "avspo", config=equal)  # not the trainer's node: the process's own fallback
    fallback = run_state.tracker_for(equal, "avspo")
    assert fallback is not trainer_tracker and fallback.controller.step == 1 and trainer_tracker.controller.step == 2
    assert run_state.tracker_for(config, "avspo") is trainer_tracker
    del config, trainer_tracker  # the node gone, its entry goes with it
    assert run_state.tracker_for(equal, "avspo") is fallback


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


ARGV = """
import sys

readers = []


class Watched(list):
    # Records the file of whoever reads the command line (any way a list is read).
    def _read(self):
        readers.append(sys._getframe(2).f_code.co_filename)

    for name in ("__getitem__", "__iter__", "__len__", "__contains__", "__bool__", "index", "count", "copy"):
        def method(self, *args, _name=name):
            self._read()
            return getattr(list, _name)(self, *args)
        locals()[name] = method


bad = ["/env/lib/python3.12/site-packages/verl/trainer/main_ppo.py", "trainer.v1.trainer_mode=avspo_sync",
       "trainer.use_v1=False"]
sys.argv = Watched(bad)
sys.orig_argv = Watched(["python", "-m", "verl.trainer.main_ppo", *bad[1:]])
import verl
import verl_avspo.verl_plugin
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
get_adv_estimator_fn("avspo")
print(sorted({reader for reader in readers if "verl_avspo" in reader}))
"""


def test_import_verl_reads_no_command_line_and_raises_nothing():
    """The entry point only registers: `import verl` with stock main_ppo's command line naming our mode with the
    legacy trainer neither raises nor has any module of ours read sys.argv or sys.orig_argv (the refusal is where
    verl hands us the config: the launcher, doctor, our estimator's first call)."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""}
    result = subprocess.run([sys.executable, "-c", ARGV], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_our_estimator_refuses_our_mode_with_the_legacy_trainer_at_its_first_call():
    """verl's legacy trainer hands the estimator config.algorithm, a node of the run's config: the estimator reads
    the trainer's settings relative to it and refuses our mode with trainer.use_v1=False, with the fix."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    run_state.reset()
    data = outcome_data(*outcome_batch(torch.tensor([1.0, 1.0, 0.0, 1.0]), length=2), group_uids([2, 2], "q"))
    run = OmegaConf.create(
        {"algorithm": {"adv_estimator": "avspo"}, "trainer": {"use_v1": False, "v1": {"trainer_mode": "avspo_sync"}}}
    )
    with pytest.raises(ValueError) as refused:
        compute_advantage(data, "avspo", config=run.algorithm)
    assert str(refused.value) == (
        "trainer.v1.trainer_mode=avspo_sync is a V1 trainer, and trainer.use_v1=False runs verl's legacy trainer, "
        "which never reads it: the run would log no acr/*, save no run state and give no stall alert. Set "
        "trainer.use_v1=True."
    )
    # verl's own mode with the legacy trainer, and our mode with V1 (where verl built our trainer), are not refused.
    for use_v1, mode in ((False, "sync"), (True, "avspo_sync")):
        run.trainer.use_v1, run.trainer.v1.trainer_mode = use_v1, mode
        compute_advantage(data, "avspo", config=run.algorithm)
    run_state.reset()


def test_the_entry_point_registers_our_trainers_only_once_verls_v1_package_is_imported():
    """The entry point stays light (test_entry_point_imports_nothing_beyond_core_algos) and still puts our modes in
    verl's trainer registry wherever verl's V1 package is imported: a fresh process, as verl's TaskRunner does."""
    code = (
        "import sys, verl\n"
        "print('verl_avspo.verl_plugin.trainer_v1' in sys.modules)\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "modes = ('avspo_sync', 'avspo_colocate_async', 'avspo_separate_async')\n"
        "print(*(get_trainer_cls(mode).__name__ for mode in modes))\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-4:] == [
        "False",
        "AVSPOTrainerSync",
        "AVSPOTrainerColocateAsync",
        "AVSPOTrainerSeparateAsync",
    ]
