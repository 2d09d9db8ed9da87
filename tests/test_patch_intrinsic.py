"""patches/verl-0.9.1-intrinsic.patch (INTUITOR's self-certainty in verl's FSDP engine) applies to
the installed verl 0.9.1 sources.

The two files it touches are copied to a temporary tree and patched there with ``patch -p1``.
The patched ``torch_functional`` is imported from that copy and its new function is checked
against ``verl_avspo.intrinsic`` on a tiny CPU input; the patched FSDP engine module is compiled
(running it needs a GPU worker) and the launcher's detection reads it as patched.
"""

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import verl

from verl_avspo import main_ppo
from verl_avspo.intrinsic import token_self_certainty

PATCH = Path(__file__).resolve().parents[1] / "patches" / "verl-0.9.1-intrinsic.patch"
FILES = ["verl/utils/torch_functional.py", "verl/workers/engine/fsdp/transformer_impl.py"]

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory):
    tree = tmp_path_factory.mktemp("verl_intrinsic")
    installed = Path(verl.__file__).resolve().parent.parent
    for name in FILES:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(installed / name, tree / name)
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)], cwd=tree, check=True)
    return tree


def test_patch_touches_only_the_two_engine_files():
    touched = [line.split()[-1][2:] for line in PATCH.read_text().splitlines() if line.startswith("+++ ")]
    assert touched == FILES


def test_patched_self_certainty_equals_ours_on_a_tiny_input(patched_tree):
    spec = importlib.util.spec_from_file_location("patched_torch_functional", patched_tree / FILES[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(torch.bfloat16)
    theirs = module.self_certainty_from_logits(logits)
    assert theirs.dtype == torch.float32 and theirs.shape == (3, 5)
    torch.testing.assert_close(theirs, token_self_certainty(logits), rtol=0, atol=1e-5)
    assert torch.allclose(module.self_certainty_from_logits(torch.zeros(2, 7)), torch.zeros(2), atol=1e-6)


def test_patched_engine_compiles_and_the_launcher_sees_the_patch(patched_tree, monkeypatch):
    engine = patched_tree / FILES[1]
    source = engine.read_text()
    compile(source, str(engine), "exec")
    assert 'model_output["self_certainty"] = self_certainty' in source
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=str(engine)))
    assert main_ppo.verl_has_self_certainty() is True
