"""The inventory of OpenRLHF names the adapter relies on (verl_avspo.openrlhf.surface), against the installed
OpenRLHF: each entry present, callable with the arguments the adapter passes, its format or copied rule
still OpenRLHF's (the entry's probe); and no private OpenRLHF name in the adapter's source that the inventory
does not list. A failure names the symbol, OpenRLHF's version and what to do."""

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

import verl_avspo.openrlhf
from verl_avspo.core.surface import framework_names, private_names_used, surface_problem
from verl_avspo.openrlhf.compat import SUPPORTED_VERSIONS
from verl_avspo.openrlhf.surface import SURFACE, namespaces

pytestmark = pytest.mark.openrlhf

if importlib.util.find_spec("openrlhf") is None:
    pytest.skip("openrlhf is not installed (make setup installs it with --no-deps)", allow_module_level=True)

WING = Path(verl_avspo.openrlhf.__file__).parent


def fix(touch) -> str:
    return (
        f"{touch.used_in} relies on it ({touch.why}). Adapt {touch.used_in} to OpenRLHF "
        f"{importlib.metadata.version('openrlhf')} and update verl_avspo/openrlhf/surface.py, or install "
        f"openrlhf{SUPPORTED_VERSIONS}"
    )


@pytest.mark.parametrize("touch", SURFACE, ids=[f"{i}-{touch.name}" for i, touch in enumerate(SURFACE)])
def test_each_listed_name_is_as_the_adapter_uses_it(openrlhf, touch):
    problem = surface_problem(touch)
    assert problem is None, f"{touch.name}: {problem}. {fix(touch)}"


def test_the_adapter_touches_no_unlisted_private_openrlhf_name(openrlhf):
    ours = {name for name in private_names_used(WING.glob("*.py")) if name.startswith("_verl_avspo")}
    theirs = framework_names(namespaces())
    listed = {touch.attribute for touch in SURFACE}
    unlisted = {
        name: places
        for name, places in private_names_used(WING.glob("*.py")).items()
        if name in theirs and name not in listed and name not in ours
    }
    assert not unlisted, (
        f"private OpenRLHF {importlib.metadata.version('openrlhf')} names used but not in "
        f"verl_avspo/openrlhf/surface.py: {unlisted}. List each (where, why no public door serves) or stop using it."
    )


def test_a_name_openrlhf_lost_is_named_with_what_to_do(openrlhf, monkeypatch):
    touch = next(t for t in SURFACE if t.attribute == "_sample_buffer")
    generate = openrlhf.sg.SamplesGenerator.generate_samples

    def without_a_buffer(self, **kwargs):
        return generate(self, **kwargs)

    monkeypatch.setattr(openrlhf.sg.SamplesGenerator, "generate_samples", without_a_buffer)
    assert "no longer sets or reads ._sample_buffer" in surface_problem(touch)
    monkeypatch.undo()
    touch = next(t for t in SURFACE if t.attribute == "_compute_rollout_stats")
    monkeypatch.delattr(openrlhf.pt.BasePPOTrainer, "_compute_rollout_stats")
    assert surface_problem(touch) == "openrlhf.trainer.ppo_trainer.BasePPOTrainer._compute_rollout_stats is missing"
    monkeypatch.undo()
    monkeypatch.setattr(openrlhf.pt.BasePPOTrainer, "_compute_rollout_stats", lambda self: {})
    assert "does not take 2 positional arguments" in surface_problem(touch)


def test_an_unlisted_private_name_is_found(openrlhf, tmp_path):
    """The source scan finds a private OpenRLHF name (here one the inventory lists) where the adapter spells
    it as an attribute or as a getattr string, and not a private name of its own."""
    source = tmp_path / "wrap.py"
    source.write_text("x = generator._sample_buffer\ny = getattr(module, '_collect_prompt_batch')\nz = self._own\n")
    used = private_names_used([source])
    theirs = framework_names(namespaces())
    assert {name for name in used if name in theirs} == {"_sample_buffer", "_collect_prompt_batch"}
    assert used["_sample_buffer"] == ["wrap.py:1"]
