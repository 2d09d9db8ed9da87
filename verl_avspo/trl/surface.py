"""Every TRL (and transformers ``Trainer``) name the adapter relies on that is private or undocumented, where it
is used and why no public door serves (TRL 1.16; docs/trl.md). TRL has no advantage hook
(huggingface/trl#4525): the adapter overrides ``GRPOTrainer``'s private methods around its reward and
advantage stage, the door TRL's maintainers point to. The wing replaces no TRL, transformers or verl function and
installs no import hook: ``AVSPOGRPOTrainer`` is an ordinary subclass, chosen by the user. (Letting verl 0.9.1
train next to TRL 1.16 is the verl wing's: ``verl_plugin/trl_guard.py``, listed in ``verl_plugin/surface.py``.)
``tests/trl/test_trl_surface.py`` checks every entry against the installed TRL, and that the adapter's source
touches no other private TRL or transformers name.

Importing this module imports neither TRL nor transformers: the checks import them when they run.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from types import SimpleNamespace

from verl_avspo.core.surface import Touch, resolve
from verl_avspo.trl.prompts import TRL_KEPT_COLUMNS
from verl_avspo.trl.settings import TRL_CHOICES

__all__ = ["SURFACE", "namespaces"]

GRPO = "trl:GRPOTrainer"
TRAINER = "transformers:Trainer"
SCORE_STAGE = f"{GRPO}._generate_and_score_completions"
NO_HOOK = "TRL has no advantage hook (huggingface/trl#4525)"


def _code(name: str):
    return inspect.unwrap(resolve(name)).__code__


def _probe_score_stage() -> str | None:
    """``_generate_and_score_completions`` scores a completion as the weighted ``nansum`` of its rewards
    (``sum_then_normalize``, the score the adapter measures and AVSPO uses) and returns a dict whose
    ``advantages`` entry holds this process's rows (which AVSPO's replace)."""
    code = _code(SCORE_STAGE)
    missing = [name for name in ("nansum", "reward_weights", "_calculate_rewards") if name not in code.co_names]
    missing += [text for text in ("sum_then_normalize", "advantages") if text not in code.co_consts]
    if missing:
        return f"GRPOTrainer._generate_and_score_completions no longer uses {', '.join(missing)}"
    return None


def _probe_kept_columns() -> str | None:
    """TRL keeps the columns ``TRL_KEPT_COLUMNS`` (``trl/prompts.py``) with ``remove_unused_columns=True``."""
    trainer = SimpleNamespace(_signature_columns=None)
    resolve(f"{GRPO}._set_signature_columns_if_needed")(trainer)
    if tuple(trainer._signature_columns or ()) != TRL_KEPT_COLUMNS:
        return f"GRPOTrainer keeps the columns {trainer._signature_columns}, not {list(TRL_KEPT_COLUMNS)}"
    return None


def _probe_choices() -> str | None:
    """The values ``TRL_CHOICES`` (``trl/settings.py``) lists for the GRPOConfig options TRL checks only at
    the first generation or loss are the ones each option's help (TRL's documentation of it) names."""
    fields = {field.name: field for field in dataclasses.fields(resolve("trl:GRPOConfig"))}
    problems = []
    for option, values in TRL_CHOICES.items():
        if option not in fields:
            problems.append(f"GRPOConfig has no {option}")
            continue
        # Quoted values, 'grpo' or `group' as TRL writes them; not a value of another option (level='sequence').
        documented = set(re.findall(r"(?<![=\w])[`']([a-z_]+)'", fields[option].metadata.get("help", "")))
        if documented != set(values):
            problems.append(f"GRPOConfig.{option}'s help names {sorted(documented)}, TRL_CHOICES {sorted(values)}")
    return "; ".join(problems) or None


SURFACE = (
    Touch(
        f"{GRPO}._calculate_rewards",
        "trl/trainer.py",
        f"{NO_HOOK}: the one place the rewards of every process's completions are gathered, per reward function",
        call=(5, ()),
    ),
    Touch(
        SCORE_STAGE,
        "trl/trainer.py",
        f"{NO_HOOK}: the reward and advantage stage, around which the prompt keys are gathered, prompts skipped, "
        "the scores measured and AVSPO's advantages replace output['advantages']",
        call=(2, ()),
        probe=_probe_score_stage,
    ),
    Touch(
        f"{GRPO}._metrics",
        "trl/trainer.py",
        "TRL's per-mode metric lists, averaged and logged by its log(): acr/*, avspo/* and prompts/* join them "
        "(no public way to add metrics to a TRL step)",
        set_by="__init__",
    ),
    Touch(
        f"{GRPO}._logs",
        "trl/trainer.py",
        "the completions table's advantages, replaced by the ones trained on when AVSPO computes them",
        set_by="__init__",
    ),
    Touch(
        f"{GRPO}.reward_funcs",
        "trl/trainer.py",
        "replaced by the same functions wrapped with the check of their values (a value that is no number)",
        set_by="__init__",
    ),
    Touch(
        f"{GRPO}.reward_func_names",
        "trl/trainer.py",
        "each reward function's name, for the messages about its values",
        set_by="__init__",
    ),
    Touch(
        f"{GRPO}.reward_weights",
        "trl/trainer.py",
        "the weights of TRL's score, which the adapter's score repeats",
        set_by="__init__",
    ),
    Touch(
        f"{GRPO}.num_generations_eval",
        "trl/trainer.py",
        "the group size of an evaluation's batch",
        set_by="__init__",
    ),
    Touch(
        f"{TRAINER}._save_checkpoint",
        "trl/trainer.py",
        "transformers' checkpoint save, after which the run tracker's state is written into the same "
        "checkpoint-N folder; no callback sees the folder before TRL's rotation",
        call=(3, ()),
    ),
    Touch(
        f"{TRAINER}._load_optimizer_and_scheduler",
        "trl/trainer.py",
        "the one call with the resumed checkpoint's folder on every process, before the first step",
        call=(2, ()),
    ),
    Touch(
        f"{TRAINER}._get_output_dir",
        "trl/trainer.py",
        "the folder the checkpoint was saved in (a hyperparameter search's trial included)",
        call=(1, ("trial",)),
    ),
    Touch(
        f"{GRPO}._set_signature_columns_if_needed",
        "trl/prompts.py (TRL_KEPT_COLUMNS)",
        "a copied rule: the dataset columns TRL keeps, so the prompt key column is refused before training "
        "where TRL would drop it",
        probe=_probe_kept_columns,
    ),
    Touch(
        "trl:GRPOConfig",
        "trl/settings.py (TRL_CHOICES)",
        "a copied rule: the values TRL accepts for scale_rewards, multi_objective_aggregation and loss_type, "
        "which it checks only at the first generation or loss; refused before the model loads",
        probe=_probe_choices,
    ),
)


def namespaces() -> list:
    """The TRL and transformers classes the adapter extends: where their private names live."""
    return [resolve(GRPO), resolve("trl:GRPOConfig")]
