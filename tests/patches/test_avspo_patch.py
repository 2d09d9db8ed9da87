"""The upstream series in ``patches/NN-*.patch`` applies to verl 0.9.1, each patch alone and all in
order, and each passes its own ``_on_cpu`` tests and verl's CPU tests for the files it touches;
with the series, the native ``avspo`` estimator and ACR metrics equal the plugin's.

verl's sources are copies of the installed verl 0.9.1 (``conftest.patched_tree``); pytest and the
parity script run in subprocesses that import verl from such a copy, with external plugins off so
that only the native estimator is registered. Nothing is mocked.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from verl_tree import SERIES, patched_tree

pytestmark = pytest.mark.verl

# verl's own CPU tests for the files each patch touches (the wheel ships no test of
# verl/utils/tracking.py, monkey_patch.py, utils/model.py, checkpoint_callback.py or the V1 trainer, replay
# buffer and agent loop, so those patches bring their own only).
VERL_TESTS = {
    "03-acr-metrics.patch": ["tests/trainer/ppo/test_metric_utils_on_cpu.py"],
    "04-avspo-estimator.patch": ["tests/trainer/ppo/test_core_algos_on_cpu.py"],
    "09-registry-listing.patch": ["tests/trainer/ppo/test_core_algos_on_cpu.py"],
}

# Runs in the patched tree: the native estimator and metrics against the plugin's framework-free
# core, step by step (the adaptive threshold, EMA and RNG carry over), on random batches of binary rewards.
PARITY = """
import itertools, sys
import numpy as np, torch
from omegaconf import OmegaConf
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_advantage_collapse_metrics
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.run_tracker import RunTracker

assert verl.__file__.startswith(sys.argv[1]), verl.__file__
settings = [
    {"strategy": s, "k": k, "threshold_init": 0.3}
    for s, k in itertools.product(["stratified", "opposite", "www", "random", "fixed", "exp_decay"], ["adaptive", 3])
] + [
    {"preset": "paper_code"}, {"preset": "grpo"}, {"apply_to": "all_wrong", "acr_signal": "ema", "eta": 0.5},
    {"apply_to": "all_correct", "reward_range": [-1.0, 1.0], "threshold_init": 0.1},
]
checked = 0
for avspo, norm in itertools.product(settings, [True, False]):
    core_algos.reset_avspo_state()
    config = OmegaConf.create({"adv_estimator": "avspo", "norm_adv_by_std_in_grpo": norm, "avspo": avspo})
    native_cfg = core_algos.get_avspo_config(config)
    resolved, acr = resolve_settings(avspo)
    tracker = RunTracker(acr, resolved)  # the plugin's one step owner, as every host runs it
    gen = torch.Generator().manual_seed(checked)
    for step in range(6):
        groups, n = 12, 8
        rate = torch.rand(groups, generator=gen) ** 3
        rate = torch.where(torch.rand(groups, generator=gen) < 0.5, rate, 1 - rate).repeat_interleave(n)
        rewards = torch.zeros(groups * n, 5)
        rewards[:, -1] = (torch.rand(groups * n, generator=gen) < rate).float()
        mask = (torch.rand(groups * n, 5, generator=gen) < 0.9).float()
        # string uids as verl makes them, and sparse integer ids on odd steps
        labels = torch.randperm(10 * groups, generator=gen)[:groups].repeat_interleave(n)
        index = labels.numpy() if step % 2 else np.array([f"uid-{v}" for v in labels.tolist()], dtype=object)
        data = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "token_level_scores": rewards, "response_mask": mask},
            non_tensors={"uid": index},
        )
        native = compute_advantage(data, "avspo", config=config)
        plugin = tracker.avspo_advantages(rewards, mask, index, norm)
        torch.testing.assert_close(native.batch["advantages"], plugin.advantages, rtol=0, atol=1e-6)
        plugin_metrics = tracker.end_step(step + 1, plugin.advantages)
        # the trainers log the ACR patch's metrics and the estimator's own avspo/* diagnostics
        metrics = compute_advantage_collapse_metrics(native, tau=native_cfg.tau, reward_range=native_cfg.reward_range)
        metrics.update(core_algos.get_avspo_metrics(config))
        # acr/reward_mean and acr/stalled belong to the stall alert, which the native version does not have.
        assert set(metrics) == set(plugin_metrics) - {"acr/reward_mean", "acr/stalled"}, sorted(metrics)
        for key, value in metrics.items():
            assert abs(plugin_metrics[key] - value) < 1e-9, (avspo, step, key, value, plugin_metrics[key])
        checked += 1
print("parity steps", checked)
"""


def _headers(patch: Path) -> list[str]:
    return [line.split()[2][2:] for line in patch.read_text().splitlines() if line.startswith("diff --git")]


def _new_tests(patch: Path) -> list[str]:
    """The test files the patch adds (``--- /dev/null``)."""
    text = patch.read_text()
    return re.findall(r"^--- /dev/null\n\+\+\+ b/(tests/\S+_on_cpu\.py)$", text, flags=re.M)


def _run(args, cwd, tree):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
        "VERL_USE_EXTERNAL_PLUGINS": "none",  # our plugin would register its own `avspo` beside the native one
        "VERL_USE_EXTERNAL_MODULES": "",
    }
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _pytest(tree: Path, tests: list[str]) -> str:
    result = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=tree, tree=tree)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    return summary


def test_the_series_is_numbered_and_each_patch_has_its_description_and_cpu_tests():
    assert [p.name[:3] for p in SERIES] == [f"{i:02d}-" for i in range(1, len(SERIES) + 1)]
    assert len(SERIES) == 9
    for patch in SERIES:
        assert patch.with_suffix(".md").exists(), patch.name
        assert all(path.startswith(("verl/", "tests/")) for path in _headers(patch)), patch.name
        assert _new_tests(patch), f"{patch.name} adds no tests/**/test_*_on_cpu.py"
    assert "verl/trainer/config/algorithm.py" in _headers(SERIES[3])


@pytest.mark.parametrize("patch", SERIES, ids=[p.stem for p in SERIES])
def test_each_patch_applies_alone_and_passes_its_tests_and_verls(patch, tmp_path):
    tree = patched_tree(tmp_path, [patch])
    _pytest(tree, _new_tests(patch) + VERL_TESTS.get(patch.name, []))


def test_the_series_in_order_passes_the_tests_of_the_patches_that_share_files(series_tree):
    # A patch whose files no other patch touches behaves in the series as it does alone (tested above);
    # so do verl's tests of metric_utils.py and core_algos.py, which one patch each touches.
    shared = [
        patch
        for patch in SERIES
        if any(set(_headers(patch)) & set(_headers(other)) for other in SERIES if other != patch)
    ]
    # ray_trainer.py, v1/trainer_base.py and core_algos.py
    assert [p.name[:2] for p in shared] == ["01", "03", "04", "05", "06", "09"]
    _pytest(series_tree, [test for patch in shared for test in _new_tests(patch)])


def test_native_estimator_and_metrics_equal_the_plugin_on_random_batches(series_tree, tmp_path):
    result = _run([sys.executable, "-c", PARITY, str(series_tree)], cwd=tmp_path, tree=series_tree)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "parity steps 192"


def test_without_the_patch_verl_has_no_native_avspo(tmp_path):
    # The control: the same subprocess setup against the unpatched install does not know `avspo`.
    probe = "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\nget_adv_estimator_fn('avspo')\n"
    result = _run([sys.executable, "-c", probe], cwd=tmp_path, tree=tmp_path)
    assert result.returncode != 0
    assert "Unknown advantage estimator simply: avspo" in result.stderr
