"""The TRL guard (``verl_plugin.trl_guard``) that the entry point installs: verl 0.9.1's model set-up
(``apply_monkey_patch`` on a tiny random Qwen2 actor) works next to a TRL without
``AutoModelForCausalLMWithValueHead``, a value-head critic gets an error naming the TRL version and
the fixes, and the guard changes nothing where TRL is absent or has the class. In the same
interpreters, ``verl-avspo doctor``'s verdict on verl next to that TRL (``_verl_next_to_trl``).

Each case runs in a fresh interpreter (the entry point runs at ``import verl``), with a stand-in
``trl`` first on the path (``trl_stand_in``) or the installed TRL. The case with the plugins off is
the control: there verl fails as it does without this package. A verl with the upstream fix
(patches/02) is tested in tests/patches/test_trl_guard_patch.py.
"""

import importlib.util
import json

import pytest
from trl_stand_in import VERSION, run_python, stand_in_trl

pytestmark = pytest.mark.verl

# Prints one JSON line: whether the actor patch ran, the guard's state, verl's own verdict on TRL
# inside monkey_patch, and what a value-head critic on a causal-LM checkpoint raised.
PROBE = """
import json, sys
{before}
import verl
from transformers import Qwen2Config, Qwen2ForCausalLM
import verl.models.transformers.monkey_patch as monkey_patch
from verl_avspo.verl_plugin import trl_guard

config = Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
report = {{}}
try:
    monkey_patch.apply_monkey_patch(Qwen2ForCausalLM(config))
    report["actor"] = "patched"
except Exception as error:
    report["actor"] = f"{{type(error).__name__}}: {{error}}"
{after}
state = trl_guard.state(check_trl=True)
report.update(installed=state.installed, guarded=list(state.guarded), missing=state.trl_without_value_head,
              verl_sees_trl=monkey_patch.is_trl_available())
from verl_avspo.verl_plugin.doctor import _verl_next_to_trl
try:
    report["doctor"] = "ok: " + _verl_next_to_trl()
except RuntimeError as error:
    report["doctor"] = f"failed: {{error}}"
print(json.dumps(report))
"""

CRITIC = """
import torch
from verl.utils.model import load_valuehead_model
model_dir = sys.argv[0] + ".model"
Qwen2ForCausalLM(config).save_pretrained(model_dir)
try:
    load_valuehead_model(local_path=model_dir, torch_dtype=torch.float32, model_config=config, trust_remote_code=False)
except ImportError as error:
    report["critic"] = str(error)
"""

STATE_DICT = """
try:
    from trl.experimental.ppo import AutoModelForCausalLMWithValueHead as cls
except ImportError:
    from trl import AutoModelForCausalLMWithValueHead as cls
report["state_dict"] = cls.state_dict.__qualname__
"""


def _probe(tmp_path, first_on_path=(), before="", after="", **env):
    script = PROBE.format(before=before, after=after)
    done = run_python(script, first_on_path, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_actor_trains_and_critic_error_names_the_trl_version_when_trl_lacks_the_value_head(tmp_path):
    trl_root = stand_in_trl(tmp_path / "site", "none")
    after = CRITIC.replace('sys.argv[0] + ".model"', repr(str(tmp_path / "qwen2")))
    report = _probe(tmp_path, [trl_root], after=after)
    assert report["actor"] == "patched"
    assert report["installed"] and report["missing"] == VERSION and report["verl_sees_trl"] is False
    assert report["guarded"] == ["verl.models.transformers.monkey_patch", "verl.utils.model"]
    critic = report["critic"]
    assert f"trl {VERSION} has it neither in trl.experimental.ppo nor in trl" in critic
    assert str(tmp_path / "qwen2") in critic and "AutoModelForTokenClassification" in critic
    assert "patches/02-trl-value-head-import.patch" in critic
    assert report["doctor"].startswith("ok: TRL has none, and verl-avspo's guard skips verl's state_dict patch")


def test_without_the_plugin_verl_fails_on_the_same_trl(tmp_path):
    # The control: the entry point is what makes the test above pass.
    trl_root = stand_in_trl(tmp_path / "site", "none")
    report = _probe(tmp_path, [trl_root], VERL_USE_EXTERNAL_PLUGINS="none")
    assert report["actor"].startswith("ImportError: cannot import name 'AutoModelForCausalLMWithValueHead' from 'trl'")
    assert not report["installed"] and report["guarded"] == []
    assert report["doctor"].startswith(
        f"failed: verl cannot build any model next to TRL {VERSION}, which has no AutoModelForCausalLMWithValueHead, "
        "and verl-avspo's guard is not installed here: VERL_USE_EXTERNAL_PLUGINS=none tells verl not to load"
    )


def test_install_guards_verl_modules_imported_before_it(tmp_path):
    # A process that imported verl's model code before the guard (plugins off, then install by hand).
    trl_root = stand_in_trl(tmp_path / "site", "none")
    before = "import verl.models.transformers.monkey_patch, verl.utils.model\n"
    before += "from verl_avspo.verl_plugin import trl_guard\nassert trl_guard.install() and trl_guard.install()\n"
    report = _probe(tmp_path, [trl_root], before=before, VERL_USE_EXTERNAL_PLUGINS="none")
    assert report["actor"] == "patched"
    assert report["guarded"] == ["verl.models.transformers.monkey_patch", "verl.utils.model"]


@pytest.mark.parametrize("layout", ["experimental", "top"])
def test_a_trl_with_the_value_head_gets_verls_own_state_dict_patch(tmp_path, layout):
    report = _probe(tmp_path, [stand_in_trl(tmp_path / "site", layout)], after=STATE_DICT)
    assert report["actor"] == "patched"
    assert report["missing"] is None and report["verl_sees_trl"] is True
    # verl's patch replaced the stand-in's state_dict, as it does without the guard.
    assert report["state_dict"] == "apply_monkey_patch.<locals>.state_dict"
    assert report["doctor"] == "ok: TRL has it, so verl's own state_dict patch runs and the guard is idle"


def test_without_trl_the_guard_is_not_installed(tmp_path):
    report = _probe(tmp_path, before="sys.modules['trl'] = None  # find_spec('trl') is None: no TRL")
    assert report == {
        "actor": "patched",
        "installed": False,
        "guarded": [],
        "missing": None,
        "verl_sees_trl": False,
        "doctor": "ok: TRL is not installed, so verl never looks for it",
    }


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed (pip install -e '.[trl]')")
def test_the_installed_trl(tmp_path):
    # With TRL 1.16 (no value-head class) the guard is active; with a TRL that has it, verl's patch runs.
    import trl

    from verl_avspo.verl_plugin.trl_guard import trl_without_value_head

    report = _probe(tmp_path)
    assert report["actor"] == "patched" and report["installed"]
    assert report["missing"] == trl_without_value_head()
    assert report["verl_sees_trl"] is (report["missing"] is None)
    assert report["missing"] in (None, trl.__version__)
