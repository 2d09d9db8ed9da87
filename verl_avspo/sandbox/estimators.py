"""Estimator specs of the sandbox command line: ``grpo,avspo,avspo:paper_code,rloo,dapo,dapo_resample,grpo+skip``.

Each spec names an advantage estimator that verl's ``compute_advantage`` dispatches (``avspo``
comes from this package's registration), plus ``dapo``: GRPO with DAPO-style dropping of
collapsed groups *at equal rollouts*. verl's ``algorithm.filter_groups`` re-samples prompts until
the batch is full of groups with reward variance, which costs extra generation; here every
estimator samples the same ``prompts_per_step x group_size`` responses per step, and ``dapo``
drops the collapsed groups from the policy loss instead of replacing them. The loss is then a
token mean over the remaining groups only, so it is larger per kept token than GRPO's.

``dapo_resample`` is DAPO's dynamic sampling as verl runs it (``algorithm.filter_groups`` with
``max_num_gen_batches``): each step draws batches of ``prompts_per_step`` prompt groups, keeps the
groups whose rewards differ, and stops when it has ``prompts_per_step`` of them or after
``max_gen_batches`` batches; it trains on exactly ``prompts_per_step`` of them (the surplus of the
last batch is discarded, as verl does) and pays for every rollout it drew
(``train/rollouts_generated``). At the cap verl's DAPO trainer raises an error; the sandbox trains
on the groups it has (fewer, or none: then the step makes no update) and logs
``train/resample_capped``.

A ``+skip`` suffix (``grpo+skip``, ``avspo+skip``, ``avspo:paper_code+skip``) adds the pre-rollout skip
rule (``core.prompt_skip``, GRESO's rule with its default settings, seeded by the run's seed): each step
draws batches of ``prompts_per_step`` candidate prompts, rolls out only those the rule keeps, and
draws again until ``prompts_per_step`` prompts are kept (at most ``max_gen_batches`` draws; at the cap
it trains on the prompts it kept). It generates as many rollouts per step as the estimator without
it: each skipped prompt's place is filled by a further draw (``prompts/reselected``). With
``dapo_resample+skip`` a skipped prompt's place is left open in its batch, since DAPO's next batch tops
the step up only if needed: those rollouts are never generated (``prompts/rollouts_skipped``).

An ``+alloc`` suffix (``grpo+alloc``, ``avspo+alloc``; ``grpo+alloc=0.5`` sets the budget share) gives the
step's prompts unequal rollout counts with the per-prompt rollout allocator (``core.prompt_allocation``,
its default settings but the largest group, 2G, seeded by the run's seed): each step draws
``prompts_per_step`` candidates, rolls out a pilot of 2 for those whose history predicts a collapse, the
full group for the others and more (up to 2G) for those near a pass rate of 1/2, then the rest of the
group for each pilot that showed a spread; a collapsed pilot is dropped (it counts in the step's ACR and
the history). The budget share (default 1) is the step's rollout budget as a share of
``prompts_per_step`` x G. Not with ``dapo``, ``dapo_resample`` or ``+skip``: each already decides which
groups are generated or trained on, by other rules.

The paper's other baselines:

- ``dcpo``: verl's ``dcpo`` estimator and policy loss as this package registers them, so exactly
  what ``algorithm.adv_estimator=dcpo`` runs in verl: smooth advantage standardization with one
  prompt history per run, keyed by the problem's text (the loop hands the keys over as our trainer
  does), and dynamic-adaptive clipping with the sandbox's clip ratio as ε_low = ε_high and DCPO's
  ``clip_ratio_c`` of 10. Its raw ACR is on the verifier's rewards, as GRPO's.
- ``intuitor`` and ``rent``: GRPO on an intrinsic reward computed from the sampling policy's own
  logits, INTUITOR's self-certainty and RENT's negative mean token entropy (every response token;
  the sandbox's answers are at most 4 tokens long), instead of the verifier's reward. The verifier
  still measures their accuracy. Their rewards are continuous, so their groups collapse only when
  they repeat one answer, and their raw ACR is not comparable with the verifier-reward estimators'.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from verl_avspo.core.config import PRESETS
from verl_avspo.core.prompt_allocation import PromptAllocationConfig, resolve_prompt_allocation
from verl_avspo.core.prompt_skip import PromptSkipConfig

__all__ = ["EstimatorSpec", "parse_estimators", "SUPPORTED", "INTRINSIC_REWARDS", "SKIP_SUFFIX", "ALLOC_SUFFIX"]

# Outcome estimators that need only rewards, the response mask and uid (no critic, no baseline
# rollouts, no extra actor statistics), so the sandbox can drive them unchanged.
SUPPORTED = (
    "grpo",
    "rloo",
    "avspo",
    "dapo",
    "dapo_resample",
    "dcpo",
    "intuitor",
    "rent",
    "grpo_passk",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
)
# The suffix that adds the pre-rollout skip rule to an estimator.
SKIP_SUFFIX = "+skip"
# The suffix that adds the rollout allocator, optionally with its budget share: +alloc, +alloc=0.5.
ALLOC_SUFFIX = "+alloc"
# Estimators trained on a reward computed from the policy's logits instead of the verifier's.
INTRINSIC_REWARDS = {"intuitor": "self_certainty", "rent": "negative_entropy"}


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator of a comparison.

    Attributes:
        label: as written on the command line, e.g. ``avspo:paper_code``; names the run.
        adv_estimator: verl's ``algorithm.adv_estimator``.
        preset: the AVSPO preset (``avspo`` only).
        drop_collapsed: DAPO-style filtering of collapsed groups before the policy loss.
        resample: DAPO's dynamic sampling: draw more prompt groups until the step's batch is full of
            non-collapsed ones (implies ``drop_collapsed``).
        reward: ``verifier`` (exact match), or the intrinsic ``self_certainty`` / ``negative_entropy``.
        skip: the pre-rollout skip rule (``+skip``).
        budget_share: the rollout allocator's budget share (``+alloc``, ``+alloc=<share>``); None: every
            prompt gets G rollouts.
    """

    label: str
    adv_estimator: str
    preset: str | None = None
    drop_collapsed: bool = False
    resample: bool = False
    reward: str = "verifier"
    skip: bool = False
    budget_share: float | None = None

    @property
    def intrinsic(self) -> bool:
        """True when the training reward is not the verifier's."""
        return self.reward != "verifier"

    @property
    def dcpo(self) -> bool:
        """True for DCPO, whose estimator needs prompt keys and whose policy loss is its own."""
        return self.adv_estimator == "dcpo"

    def prompt_skip(self, seed: int) -> PromptSkipConfig | None:
        """The skip rule's settings (its defaults, seeded by the run's seed), or None without ``+skip``."""
        return PromptSkipConfig(enable=True, seed=seed) if self.skip else None

    def prompt_allocation(self, seed: int, group_size: int) -> PromptAllocationConfig | None:
        """The rollout allocator's settings (its defaults, the spec's budget share, seeded by the run's seed,
        the largest group 2G), or None without ``+alloc``."""
        if self.budget_share is None:
            return None
        # 2G, the ratio the allocator's default of 16 keeps at G = 8: at the sandbox's G = 16 the default
        # would equal G and turn the extras near p = 1/2 off.
        return PromptAllocationConfig(
            enable=True, budget_share=self.budget_share, seed=seed, max_group_size=2 * group_size
        )

    def algorithm_config(self, seed: int) -> DictConfig:
        """The ``config.algorithm`` that verl's ``compute_advantage`` passes to the estimator."""
        config = {"adv_estimator": self.adv_estimator, "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0}
        if self.preset is not None:
            config["avspo"] = {"preset": self.preset, "seed": seed}
        return OmegaConf.create(config)


def parse_estimators(spec: str) -> tuple[EstimatorSpec, ...]:
    """``"grpo,avspo:paper_code,grpo+skip"`` -> specs. Raises ValueError naming the bad entry."""
    specs = []
    for item in (part.strip() for part in spec.split(",")):
        head, _, allocation = item.partition(ALLOC_SUFFIX)
        budget_share = _budget_share(item, allocation) if ALLOC_SUFFIX in item else None
        skip = head.endswith(SKIP_SUFFIX)
        base = head.removesuffix(SKIP_SUFFIX)
        name, _, preset = base.partition(":")
        if name not in SUPPORTED:
            raise ValueError(
                f"estimator {item!r} is not supported by the sandbox: choose from {', '.join(SUPPORTED)}, "
                "with an AVSPO preset as avspo:<preset>, the skip rule as <estimator>+skip and the rollout allocator "
                "as <estimator>+alloc, for example --estimators grpo,avspo,avspo:paper_code,grpo+skip,grpo+alloc"
            )
        if preset and name != "avspo":
            raise ValueError(f"estimator {item!r}: only avspo takes a preset (avspo:{preset})")
        if name == "avspo":
            preset = preset or "paper"
            if preset not in PRESETS:
                raise ValueError(
                    f"estimator {item!r}: unknown AVSPO preset {preset!r}; choose from {', '.join(PRESETS)}"
                )
        if budget_share is not None and (skip or name in ("dapo", "dapo_resample")):
            raise ValueError(
                f"estimator {item!r}: +alloc does not combine with dapo, dapo_resample or +skip in the sandbox: "
                "each decides by its own rule which groups are generated or trained on. Use grpo+alloc (or another "
                "estimator with +alloc), or drop +alloc"
            )
        if name == "dapo":
            specs.append(EstimatorSpec(item, "grpo", drop_collapsed=True, skip=skip))
        elif name == "dapo_resample":
            specs.append(EstimatorSpec(item, "grpo", drop_collapsed=True, resample=True, skip=skip))
        elif name in INTRINSIC_REWARDS:
            specs.append(
                EstimatorSpec(item, "grpo", reward=INTRINSIC_REWARDS[name], skip=skip, budget_share=budget_share)
            )
        else:
            specs.append(EstimatorSpec(item, name, preset or None, skip=skip, budget_share=budget_share))
    # Compare what the specs run, not their spelling: avspo and avspo:paper are the same run.
    seen = {}
    for s in specs:
        key = (s.adv_estimator, s.preset, s.drop_collapsed, s.resample, s.reward, s.skip, s.budget_share)
        if key in seen:
            raise ValueError(f"--estimators {spec!r}: {seen[key]!r} and {s.label!r} are one estimator; list it once")
        seen[key] = s.label
    return tuple(specs)


def _budget_share(item: str, allocation: str) -> float:
    """The budget share of ``+alloc`` (1.0) or ``+alloc=<share>``, validated by the allocator's own settings."""
    if allocation and not allocation.startswith("="):
        raise ValueError(
            f"estimator {item!r}: write the allocator as +alloc or +alloc=<budget share>, for example grpo+alloc=0.5"
        )
    try:
        share = float(allocation[1:]) if allocation else 1.0
    except ValueError:
        share = allocation[1:]
    try:
        return resolve_prompt_allocation({"budget_share": share}, section="prompt_allocation").budget_share
    except ValueError as error:
        raise ValueError(f"estimator {item!r}: {error}") from None
