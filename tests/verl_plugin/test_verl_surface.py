"""The inventory of verl names the verl wing relies on (verl_avspo.verl_plugin.surface), against the installed
verl: each entry present, callable with the arguments the wing passes, its format or copied rule still verl's
(the entry's probe); and no private verl name in the wing's source that the inventory does not list. A failure
names the symbol, verl's version and what to do."""

import importlib.metadata
import re
from pathlib import Path

import pytest

import verl_avspo.verl_plugin
from verl_avspo.core.surface import framework_names, private_names_used, surface_problem
from verl_avspo.verl_plugin.surface import SURFACE, namespaces

pytestmark = pytest.mark.verl

WING = Path(verl_avspo.verl_plugin.__file__).parent
# The inventory itself names what it lists, and its probes' stand-ins.
SOURCES = sorted(path for path in WING.rglob("*.py") if path.name != "surface.py")


def fix(touch) -> str:
    return (
        f"{touch.used_in} relies on it ({touch.why}). Adapt {touch.used_in} to verl "
        f"{importlib.metadata.version('verl')} and update verl_avspo/verl_plugin/surface.py, or install verl==0.9.1"
    )


@pytest.mark.parametrize("touch", SURFACE, ids=[f"{i}-{touch.name}" for i, touch in enumerate(SURFACE)])
def test_each_listed_name_is_as_the_wing_uses_it(touch):
    problem = surface_problem(touch)
    assert problem is None, f"{touch.name}: {problem}. {fix(touch)}"


def unlisted_private_names(sources) -> dict[str, list[str]]:
    theirs = framework_names(namespaces())
    listed = {touch.attribute for touch in SURFACE}
    return {
        name: places
        for name, places in private_names_used(sources).items()
        if name in theirs and name not in listed and not name.startswith("_verl_avspo")
    }


def test_the_wing_touches_no_unlisted_private_verl_name():
    unlisted = unlisted_private_names(SOURCES)
    assert not unlisted, (
        f"private verl {importlib.metadata.version('verl')} names used but not in verl_avspo/verl_plugin/surface.py: "
        f"{unlisted}. List each (where, why no public door serves) or stop using it."
    )


def test_an_unlisted_private_name_is_found(tmp_path):
    """The scan finds a private verl name the inventory does not list, spelt as an attribute or a getattr string,
    and not a name of ours set on verl's objects."""
    source = tmp_path / "hooks.py"
    source.write_text(
        "a = self._validate()\nb = getattr(buffer, '_dapo_filtered_keys')\nc = self._compute_advantage\n"
        "buffer._verl_avspo_tops_up = True\n"
    )
    assert unlisted_private_names([source]) == {"_validate": ["hooks.py:1"], "_dapo_filtered_keys": ["hooks.py:2"]}


def test_a_name_verl_lost_is_named_with_what_to_do(monkeypatch):
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base

    touch = next(t for t in SURFACE if t.attribute == "_step_once")
    monkeypatch.delattr(trainer_base.PPOTrainer, "_step_once")
    assert surface_problem(touch) == "verl.trainer.ppo.v1.trainer_base.PPOTrainer._step_once is missing"
    monkeypatch.undo()
    monkeypatch.setattr(trainer_base.PPOTrainer, "_step_once", lambda self, metrics: None)
    assert "does not take 4 positional arguments" in surface_problem(touch)
    monkeypatch.undo()
    touch = next(t for t in SURFACE if t.attribute == "_clear_groups")
    monkeypatch.setattr(replay_buffer.ReplayBuffer, "_clear_groups", lambda self, partition_id, uids: None)
    assert "ReplayBuffer._clear_groups left" in surface_problem(touch)


def test_a_changed_agent_loop_protocol_is_found(monkeypatch):
    """The pilot path repeats verl's _run_prompt protocol: a verl whose _run_prompt published another status (or
    ran its sessions another way) fails the probe, naming what it did."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    touch = next(t for t in SURFACE if t.attribute == "_run_prompt")

    async def other_protocol(self, prompt, sampling_params, trajectory, trace=False):
        await agent_loop_tq.tq.async_kv_put(key=prompt["uid"], partition_id="train", tag={"status": "done"})

    monkeypatch.setattr(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__, "_run_prompt", other_protocol)
    assert surface_problem(touch) == (
        "AgentLoopWorkerTQ._run_prompt put statuses [('u', 'train', 'done')] and ran sessions [], not "
        "[('u', 'train', 'running'), ('u', 'train', 'finished')] and [(0, ['agent_name', 'uid']), "
        "(1, ['agent_name', 'uid'])]"
    )


def test_each_listed_name_has_the_public_door_a_patch_proposes():
    """patches/README.md's table of doors names every inventory entry (item 2 of the issue: for each name left, a
    patch of the series proposes the public door)."""
    readme = (WING.parents[1] / "patches" / "README.md").read_text()
    doors = readme.partition("## The doors 05-09 propose")[2].partition("\n## ")[0]
    named = {part for span in re.findall(r"`([^`]+)`", doors) for part in re.split(r"[.\s/()]+", span)}
    missing = [touch.name for touch in SURFACE if touch.attribute not in named]
    assert doors and not missing, f"patches/README.md's table of doors does not name {missing}: add each with its patch"
