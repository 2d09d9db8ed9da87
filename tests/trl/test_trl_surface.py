"""The inventory of TRL and transformers names the TRL adapter relies on (verl_avspo.trl.surface), against the
installed TRL: each entry present, callable with the arguments the adapter passes, its format or copied rule
still TRL's (the entry's probe); and no private TRL or transformers name in the adapter's source that the
inventory does not list. A failure names the symbol, TRL's version and what to do."""

from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install 'verl-avspo[trl]')")

import trl  # noqa: E402

import verl_avspo.trl  # noqa: E402
from verl_avspo.core.surface import framework_names, private_names_used, surface_problem  # noqa: E402
from verl_avspo.trl.surface import SURFACE, namespaces  # noqa: E402
from verl_avspo.trl.trainer import TESTED_TRL  # noqa: E402

WING = Path(verl_avspo.trl.__file__).parent


@pytest.mark.parametrize("touch", SURFACE, ids=[f"{i}-{touch.name}" for i, touch in enumerate(SURFACE)])
def test_each_listed_name_is_as_the_adapter_uses_it(touch):
    problem = surface_problem(touch)
    assert problem is None, (
        f"{touch.name}: {problem}. {touch.used_in} relies on it ({touch.why}). Adapt {touch.used_in} to TRL "
        f"{trl.__version__} and update verl_avspo/trl/surface.py, or install trl{TESTED_TRL}"
    )


def test_the_adapter_touches_no_unlisted_private_trl_name():
    used = private_names_used(WING.glob("*.py"))
    # The adapter's own private names: defined by it, and no TRL or transformers class has them.
    theirs = framework_names(namespaces())
    listed = {touch.attribute for touch in SURFACE} | {"_signature_columns"}  # the probe's, not the adapter's
    unlisted = {name: places for name, places in used.items() if name in theirs and name not in listed}
    assert not unlisted, (
        f"private TRL {trl.__version__} names used but not in verl_avspo/trl/surface.py: {unlisted}. "
        "List each (where, why no public door serves) or stop using it."
    )


def test_a_copied_rule_that_changed_is_named(monkeypatch):
    from verl_avspo.trl import surface

    monkeypatch.setitem(surface.TRL_CHOICES, "loss_type", ("grpo", "dr_grpo"))
    touch = next(t for t in SURFACE if t.name == "trl:GRPOConfig")
    assert "GRPOConfig.loss_type's help names" in surface_problem(touch)
