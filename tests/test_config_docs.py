"""The settings' documentation agrees with the code: every field of the config dataclasses
(``AVSPOConfig``, ``ACRConfig``, ``AlertConfig``, ``DCPOConfig``, ``IntrinsicConfig``, ``PromptsConfig``) has a
one-line attribute docstring, and docs/configuration.md's key tables list exactly those fields, the skip
rule's (``PromptSkipConfig``) and the rollout allocator's (``PromptAllocationConfig``), each with its default."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import yaml

from verl_avspo.core import acr_config, baseline_settings, config
from verl_avspo.core.baseline_settings import DCPOConfig, IntrinsicConfig
from verl_avspo.core.config import ACRConfig, AlertConfig, AVSPOConfig
from verl_avspo.core.prompt_allocation import PromptAllocationConfig
from verl_avspo.core.prompt_skip import PromptSkipConfig
from verl_avspo.verl_plugin import prompt_identity
from verl_avspo.verl_plugin.prompt_identity import PromptsConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
CONFIGS = (AVSPOConfig, ACRConfig, AlertConfig, DCPOConfig, IntrinsicConfig, PromptsConfig)
# A table row: | `key` | `default` ... |
ROW = re.compile(r"^\| `([\w.]+)` \| `([^`]*)`")


def documented_defaults() -> dict[str, object]:
    """Each key of configuration.md's key tables (before its presets) and its default, read as YAML
    (1e-6 as a number)."""
    rows = {}
    keys_part = DOC.read_text(encoding="utf-8").split("\n## Presets")[0]
    for line in keys_part.splitlines():
        match = ROW.match(line)
        if match and not match.group(1).startswith(("algorithm.adv_estimator", "algorithm.norm_adv", "actor_")):
            key, text = match.groups()
            try:
                value = float(text) if re.fullmatch(r"[\d.]+e-?\d+", text) else yaml.safe_load(text)
            except yaml.YAMLError:
                value = text
            rows[key] = value
    return rows


def code_defaults() -> dict[str, object]:
    """Every field of the config dataclasses under the key a user types, with its default."""
    keys: dict[str, object] = {}
    sections = ((AVSPOConfig, ""), (ACRConfig, "algorithm.acr."), (AlertConfig, "algorithm.acr.alert."),
                (DCPOConfig, "algorithm.dcpo."), (IntrinsicConfig, "algorithm.intrinsic."),
                (PromptsConfig, "algorithm.prompts."), (PromptSkipConfig, "algorithm.prompts.skip."),
                (PromptAllocationConfig, "algorithm.prompts.allocation."))  # fmt: skip
    for cls, prefix in sections:
        instance = cls()
        for field in dataclasses.fields(cls):
            own_sections = ((ACRConfig, "alert"), (PromptsConfig, "skip"), (PromptsConfig, "allocation"))
            if (cls, field.name) not in own_sections:
                value = getattr(instance, field.name)
                keys[prefix + field.name] = list(value) if isinstance(value, tuple) else value
    return keys


def test_a_flat_mapping_holds_both_configs_side_by_side():
    avspo, acr = config.resolve_settings({"tau": 1e-3, "reward_range": [-1, 1], "alert": {"window": 7}, "gap": 0.2})
    assert acr == ACRConfig(tau=1e-3, reward_range=(-1.0, 1.0), alert=AlertConfig(window=7))
    assert avspo == AVSPOConfig(gap=0.2)
    assert config.resolve_settings({}) == (AVSPOConfig(), ACRConfig())  # the paper preset's defaults
    # algorithm.avspo holds the estimator's keys only: ACR's have their own section.
    assert config.AVSPO_KEYS == tuple(f.name for f in dataclasses.fields(AVSPOConfig))
    assert set(config.AVSPO_KEYS).isdisjoint(config.ACR_KEYS)


def test_configuration_md_lists_exactly_the_fields_with_their_defaults():
    documented, code = documented_defaults(), code_defaults()
    assert sorted(documented) == sorted(code)
    assert documented == code


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_config_field_has_a_one_line_docstring(cls):
    modules = {AVSPOConfig: config, ACRConfig: acr_config, AlertConfig: acr_config, PromptsConfig: prompt_identity}
    module = modules.get(cls, baseline_settings)
    tree = ast.parse(inspect.getsource(module))
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    documented = {}
    for statement, following in zip(node.body, node.body[1:] + [None], strict=True):
        if isinstance(statement, ast.AnnAssign):
            doc = following.value.value if isinstance(following, ast.Expr) else None
            documented[statement.target.id] = doc
    assert set(documented) == {f.name for f in dataclasses.fields(cls)}
    undocumented = [name for name, doc in documented.items() if not isinstance(doc, str) or "\n" in doc.strip()]
    assert undocumented == []
