"""On a verl with the upstream fix (patches/02-trl-value-head-import.patch), the entry point's TRL
guard (``verl_plugin.trl_guard``) changes nothing: verl's own code imports the value-head class only
for a value-head model, and raises its own error where TRL lacks it; ``verl-avspo doctor`` says so.
A stand-in ``trl`` without the class is first on the path (``trl_stand_in``); the plugins are on, as
in a user's environment."""

import json

import pytest
from trl_stand_in import VERSION, run_python, stand_in_trl
from verl_tree import SERIES, patched_tree

pytestmark = pytest.mark.verl

PROBE = """
import json, sys
import verl
from transformers import Qwen2Config, Qwen2ForCausalLM
import verl.models.transformers.monkey_patch as monkey_patch
import verl.utils.model as model_utils
from verl_avspo.verl_plugin import trl_guard

assert verl.__file__.startswith(sys.argv[1]), verl.__file__
config = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
monkey_patch.apply_monkey_patch(Qwen2ForCausalLM(config))
state = trl_guard.state(check_trl=True)
report = {"installed": state.installed, "guarded": list(state.guarded), "missing": state.trl_without_value_head,
          "load_valuehead_model": model_utils.load_valuehead_model.__module__ + "." +
                                  model_utils.load_valuehead_model.__qualname__}
try:
    model_utils.get_trl_value_head_class()
except ImportError as error:
    report["error"] = str(error)
from verl_avspo.verl_plugin.doctor import _verl_next_to_trl
report["doctor"] = _verl_next_to_trl()
print(json.dumps(report))
"""


def test_the_guard_leaves_a_verl_with_patch_02_alone(tmp_path):
    tree = patched_tree(tmp_path / "verl", [p for p in SERIES if p.name.startswith("02-")])
    trl_root = stand_in_trl(tmp_path / "site", "none")
    done = run_python(PROBE.replace("sys.argv[1]", repr(str(tree))), [tree, trl_root])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["installed"] and report["missing"] == VERSION
    assert report["guarded"] == []
    assert report["load_valuehead_model"] == "verl.utils.model.load_valuehead_model"
    assert report["error"].startswith("The critic needs trl's AutoModelForCausalLMWithValueHead")
    assert report["doctor"] == "verl imports it only for a value-head critic (verl carries patches/02), so the guard is idle"
