"""The upstream patch in ``patches/`` applies to verl 0.9.1 and makes ``avspo`` native.

The installed verl 0.9.1 sources (and the ``tests`` package its wheel ships) are copied to a
temporary directory, the patch is applied there with ``patch -p1`` (or ``git apply``), and verl is
imported from that copy in subprocesses, with external plugins off so that only the native
estimator is registered. Nothing is mocked.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl

PATCH = Path(__file__).resolve().parents[2] / "patches" / "verl-0.9.1-avspo.patch"
PATCH_TESTS = ["tests/trainer/ppo/test_avspo_on_cpu.py", "tests/trainer/ppo/test_advantage_collapse_metrics_on_cpu.py"]
VERL_TESTS = ["tests/trainer/ppo/test_core_algos_on_cpu.py", "tests/trainer/ppo/test_metric_utils_on_cpu.py"]

# Runs in the patched tree: the native estimator against the plugin's framework-free core, step by
# step (the adaptive threshold, EMA and RNG carry over), on random batches of binary rewards.
PARITY = """
import itertools, sys
import numpy as np, torch
from omegaconf import OmegaConf
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.metric_utils import compute_advantage_collapse_metrics
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl_avspo.core.advantage import compute_avspo_outcome_advantage
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.controller import AdaptiveController

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
    resolved, acr = resolve_settings(avspo)
    controller = AdaptiveController(resolved, acr)
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
        plugin = compute_avspo_outcome_advantage(rewards, mask, index, resolved, acr, controller, norm)
        torch.testing.assert_close(native.batch["advantages"], plugin.advantages, rtol=0, atol=1e-6)
        metrics = compute_advantage_collapse_metrics(native, config)
        # acr/reward_mean is read only by the stall alert, which the native version does not have.
        assert set(metrics) == set(plugin.metrics) - {"acr/reward_mean"}, sorted(metrics)
        for key, value in metrics.items():
            assert abs(plugin.metrics[key] - value) < 1e-9, (avspo, step, key, value, plugin.metrics[key])
        checked += 1
print("parity steps", checked)
"""


def _run(args, cwd, tree):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
        "VERL_USE_EXTERNAL_PLUGINS": "none",  # our plugin would register its own `avspo` beside the native one
        "VERL_USE_EXTERNAL_MODULES": "",
    }
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory):
    """A copy of the installed verl 0.9.1 sources with the patch applied."""
    site = Path(importlib.util.find_spec("verl").origin).parents[1]
    tree = tmp_path_factory.mktemp("verl-0.9.1")
    for package in ("verl", "tests"):
        shutil.copytree(site / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert (tree / "verl" / "version" / "version").read_text().strip() == "0.9.1"
    if shutil.which("patch"):
        command = ["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)]
    else:
        command = ["git", "apply", "--verbose", str(PATCH)]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return tree


def test_patch_touches_only_verl_sources_and_its_own_tests():
    headers = [line.split()[2] for line in PATCH.read_text().splitlines() if line.startswith("diff --git")]
    assert all(path.startswith(("a/verl/", "a/tests/trainer/ppo/test_")) for path in headers), headers
    assert {f"a/{path}" for path in PATCH_TESTS} <= set(headers)
    assert "a/verl/trainer/ppo/core_algos.py" in headers and "a/verl/trainer/config/algorithm.py" in headers


def test_patch_tests_and_verl_core_algos_tests_pass_on_the_patched_tree(patched_tree):
    result = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PATCH_TESTS, *VERL_TESTS],
        cwd=patched_tree,
        tree=patched_tree,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary


def test_native_estimator_equals_the_plugin_on_random_batches(patched_tree, tmp_path):
    result = _run([sys.executable, "-c", PARITY, str(patched_tree)], cwd=tmp_path, tree=patched_tree)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "parity steps 192"


def test_without_the_patch_verl_has_no_native_avspo(tmp_path):
    # The control: the same subprocess setup against the unpatched install does not know `avspo`.
    probe = "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\nget_adv_estimator_fn('avspo')\n"
    result = _run([sys.executable, "-c", probe], cwd=tmp_path, tree=tmp_path)
    assert result.returncode != 0
    assert "Unknown advantage estimator simply: avspo" in result.stderr
