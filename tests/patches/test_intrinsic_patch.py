"""patches/verl-0.9.1-intrinsic.patch (INTUITOR's self-certainty in verl's FSDP engine) applies to
the installed verl 0.9.1 sources, and the patched engine returns what INTUITOR needs.

The two files it touches are copied to a temporary tree and patched there with ``patch -p1``; the
patched ``torch_functional`` is checked against ``verl_avspo.core.intrinsic`` on a tiny input. Then a
copy of the whole installed verl is patched and, in a subprocess that imports that copy, the
patched ``FSDPEngineWithLMHead.forward_step`` runs on CPU (a tiny random Qwen2, with and without
remove-padding): its per-token ``self_certainty`` and ``entropy`` equal ours on the model's own
logits. What is stood in, because it needs a GPU: the engine is built without ``__init__`` (no FSDP
wrapping, no device mesh) and the module's device lookups return ``cpu``.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import verl

from verl_avspo.core.intrinsic import token_entropy, token_self_certainty
from verl_avspo.verl_plugin.checks import resources

PATCH = Path(__file__).resolve().parents[2] / "patches" / "verl-0.9.1-intrinsic.patch"
FILES = ["verl/utils/torch_functional.py", "verl/workers/engine/fsdp/transformer_impl.py"]

pytestmark = [pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch"), pytest.mark.verl]


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
    # Chunked over positions (bounded float32 memory); the chunking does not change the values.
    torch.testing.assert_close(module.self_certainty_from_logits(logits, chunk_size=4), theirs, rtol=0, atol=1e-6)
    assert module.self_certainty_from_logits(torch.zeros(0, 7)).shape == (0,)


def test_patched_engine_compiles_and_the_launcher_sees_the_patch(patched_tree, monkeypatch):
    engine = patched_tree / FILES[1]
    source = engine.read_text()
    compile(source, str(engine), "exec")
    assert 'model_output["self_certainty"] = self_certainty' in source
    monkeypatch.setattr(resources, "verl_package_dir", lambda: patched_tree / "verl")
    assert resources.verl_has_self_certainty() is True


# ---- the patched engine's forward pass on CPU -----------------------------------------------------


def engine_outputs(use_remove_padding: bool, temperature: float = 1.0) -> dict:
    """Run verl's FSDPEngineWithLMHead.forward_step (forward only, entropy and self-certainty
    requested, as the V1 trainer's old-log-prob pass does for INTUITOR) on three sequences of a
    tiny random Qwen2. Returns the output keys and the largest differences from our functions on
    the model's logits of each sequence alone, divided by the sampling temperature as verl does for
    log-probs and entropy. Runs against whichever verl is imported."""
    from tensordict import TensorDict
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig
    from verl.workers.engine.fsdp import transformer_impl

    # Stand-ins for what needs a GPU: device lookups, and the FSDP set-up that __init__ does.
    transformer_impl.get_device_name = lambda: "cpu"
    transformer_impl.get_device_id = lambda: "cpu"
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = Qwen2ForCausalLM(config).eval()
    engine = object.__new__(transformer_impl.FSDPEngineWithLMHead)
    engine.module = model
    engine.engine_config = FSDPEngineConfig(use_torch_compile=False)
    engine.compute_entropy_from_logits = transformer_impl.verl_F.entropy_from_logits
    engine.pad_to_length, engine.use_ulysses_sp, engine._autocast_dtype = False, False, torch.float32

    sequences = [torch.randint(0, 50, (n,)) for n in (5, 9, 3)]
    micro_batch = TensorDict(
        {
            "input_ids": torch.nested.as_nested_tensor(sequences, layout=torch.jagged),
            "position_ids": torch.nested.as_nested_tensor(
                [torch.arange(len(s)) for s in sequences], layout=torch.jagged
            ),
        },
        batch_size=[len(sequences)],
    )
    tu.assign_non_tensor(
        micro_batch,
        use_remove_padding=use_remove_padding,
        calculate_entropy=True,
        calculate_self_certainty=True,
        temperature=temperature,
    )
    with torch.no_grad():
        _, output = engine.forward_step(micro_batch, loss_function=None, forward_only=True)
        logits = [model(s[None]).logits[0] / temperature for s in sequences]
    model_output = output["model_output"]
    result = {"keys": sorted(model_output)}
    for name, ours in (("self_certainty", token_self_certainty), ("entropy", token_entropy)):
        if name in model_output:
            rows = model_output[name].unbind()
            assert [len(r) for r in rows] == [len(s) for s in sequences]
            result[name] = max(float((row - ours(z)).abs().max()) for row, z in zip(rows, logits, strict=True))
    return result


@pytest.fixture(scope="module")
def patched_verl(tmp_path_factory):
    """A patched copy of the whole installed verl package (its parent directory goes on PYTHONPATH)."""
    tree = tmp_path_factory.mktemp("verl_full")
    shutil.copytree(Path(verl.__file__).resolve().parent, tree / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)], cwd=tree, check=True)
    return tree


def run_engine(verl_tree, use_remove_padding, temperature=1.0):
    """``engine_outputs`` in a fresh interpreter that imports verl from ``verl_tree`` (None: the
    installed verl), so that neither the patched copy nor the device stand-ins reach this process."""
    script = (
        "import json, verl, test_intrinsic_patch as t; "
        f"print(json.dumps({{'verl': verl.__file__, **t.engine_outputs({use_remove_padding}, {temperature})}}))"
    )
    path = [str(verl_tree)] if verl_tree else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(Path(__file__).parent)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("use_remove_padding", "temperature"), [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_patched_engine_returns_self_certainty_equal_to_ours(patched_verl, use_remove_padding, temperature):
    result = run_engine(patched_verl, use_remove_padding, temperature)
    assert result["verl"].startswith(str(patched_verl))  # the patched copy, not the installed verl
    assert result["keys"] == ["entropy", "log_probs", "self_certainty"]
    assert result["self_certainty"] < 1e-5 and result["entropy"] < 1e-5


def test_unpatched_engine_ignores_the_flag():
    # Why the launcher refuses INTUITOR on a stock verl: the flag is silently ignored there.
    result = run_engine(None, use_remove_padding=True)
    assert result["verl"] == verl.__file__
    assert result["keys"] == ["entropy", "log_probs"] and result["entropy"] < 1e-5


def test_patched_engine_refuses_self_certainty_with_fused_kernels(patched_verl):
    script = (
        "import torch; from tensordict import TensorDict; from verl.utils import tensordict_utils as tu; "
        "from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead as E; "
        "mb = TensorDict({}, batch_size=[1]); "
        "tu.assign_non_tensor(mb, use_fused_kernels=True, calculate_self_certainty=True); "
        "E.prepare_model_outputs(object.__new__(E), None, {}, mb, None)"
    )
    env = {**os.environ, "PYTHONPATH": str(patched_verl)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "NotImplementedError: calculate_self_certainty=True is not supported with use_fused_kernels=True" in (
        done.stderr
    )


def test_verl_hands_self_certainty_back_like_entropy_in_batch_order():
    # The step after the engine: verl's real postprocess_batch_func joins the micro-batches' model
    # outputs key by key (so the new key travels to TransferQueue like entropy) and undoes the
    # dynamic-batch reordering. Two micro-batches hold rows [2, 0] and [1].
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import postprocess_batch_func

    rows = [torch.rand(n, generator=torch.Generator().manual_seed(n)) for n in (4, 2, 5)]

    def micro_batch(order):
        values = {"entropy": [rows[i] for i in order], "self_certainty": [2 * rows[i] for i in order]}
        nested = {k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in values.items()}
        return {"model_output": nested, "loss": 0.0, "metrics": {}}

    data = TensorDict({}, batch_size=[3])
    tu.assign_non_tensor(data, use_dynamic_bsz=True)
    output = postprocess_batch_func([micro_batch([2, 0]), micro_batch([1])], [[2, 0], [1]], data)["model_output"]
    assert sorted(output) == ["entropy", "self_certainty"]
    for certainty, entropy, row in zip(
        output["self_certainty"].unbind(), output["entropy"].unbind(), rows, strict=True
    ):
        assert torch.equal(entropy, row) and torch.equal(certainty, 2 * row)
