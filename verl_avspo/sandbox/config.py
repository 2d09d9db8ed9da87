"""Settings of a sandbox run, as frozen dataclasses (configs as data).

Kept free of verl and transformers imports so that the command line validates every value in a
fraction of a second, before any model is built.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field

from verl_avspo.sandbox.task import check_training_set, check_warm_up_share, parse_levels

__all__ = ["ARCHITECTURES", "MIN_EPOCHS", "PolicyConfig", "SandboxConfig"]

ARCHITECTURES = ("qwen2", "llama")


@dataclass(frozen=True)
class PolicyConfig:
    """Model size and supervised warm-up. Every field is part of the warm-up cache key."""

    architecture: str = "qwen2"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    sft_steps: int = 700
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture={self.architecture!r} is invalid: allowed values are {', '.join(ARCHITECTURES)}"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "sft_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive integer")
        if self.sft_steps < 0:
            raise ValueError(f"sft_steps={self.sft_steps} is invalid: expected an integer >= 0")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}: "
                "hidden_size must be divisible by num_heads, and num_heads by num_kv_heads"
            )


# The visits per prompt below which a fixed training set warns: real RLVR recipes train several
# epochs over their set, so that a prompt's collapse history has something to predict from.
MIN_EPOCHS = 5

# verl's loss aggregations (core_algos.agg_loss) that need no data-parallel information.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class SandboxConfig:
    """Everything a sandbox run depends on besides the estimator and the seed. The defaults are the
    calibrated instrument (docs/sandbox_calibration.md): a 700-step warm-up, then 360 steps of 16 prompts x 16
    answers, the rate rising from 0 over the first 150, 200 held-out problems per level where a level has them,
    evaluated every 20 steps."""

    levels: str = "1+1,2+1,2+2,2*1"
    steps: int = 360
    prompts_per_step: int = 16
    group_size: int = 16
    temperature: float = 1.0
    lr: float = 2e-4
    # verl's actor.optim.lr_warmup_steps_ratio: the rate rises linearly from 0 to lr over the first
    # int(ratio * steps) steps, then holds (verl's get_constant_schedule_with_warmup); 0 holds it from the
    # first step. A share of the run, so that --steps keeps the calibrated shape: 150 of the 360 steps.
    lr_warmup_steps_ratio: float = 150 / 360
    clip_ratio: float = 0.2
    mini_batches: int = 2
    grad_clip: float = 1.0
    eval_every: int = 20
    eval_size: int = 200
    # The share of each level's non-held-out problems kept for the supervised warm-up; RL trains on
    # the rest, so its prompts are new to the warmed-up policy (task.ArithmeticTask).
    warm_up_share: float = 0.5
    pass_k: int = 8
    loss_agg_mode: str = "token-mean"
    # dapo_resample: at most this many batches of prompts_per_step prompt groups per step, as verl's
    # algorithm.filter_groups.max_num_gen_batches (its DAPO recipes use 10).
    max_gen_batches: int = 10
    # None: every step draws its prompts with replacement from the levels' whole training pools (few
    # prompts are ever revisited). N: the epochs mode, as the RLVR recipes train: a fixed set of N
    # distinct prompts is drawn once per seed (evenly over the levels, a small level giving at most its
    # whole pool: task.level_shares), and the steps draw it in epochs, each a fresh permutation without
    # replacement; the skip rule's refills and DAPO's further batches draw on from the current epoch, as
    # verl's dataloader does.
    train_set: int | None = None
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self):
        parse_levels(self.levels)
        check_warm_up_share(self.warm_up_share)
        positive = ("steps", "prompts_per_step", "mini_batches", "eval_every", "eval_size", "pass_k")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive integer")
        if not 0 <= self.lr_warmup_steps_ratio <= 1:
            raise ValueError(
                f"lr_warmup_steps_ratio={self.lr_warmup_steps_ratio} is invalid: expected a share of the steps "
                "from 0 (no warm-up) to 1"
            )
        if self.max_gen_batches < 1:
            raise ValueError(
                f"max_gen_batches={self.max_gen_batches} is invalid: dapo_resample and <estimator>+skip need a cap "
                "of at least 1 batch (verl reads 0 as no limit, which loops forever once the policy solves every "
                "prompt); verl's DAPO recipes use 10"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode={self.loss_agg_mode!r} is invalid: expected one of {', '.join(LOSS_AGG_MODES)}"
            )
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} is invalid: a group needs at least 2 answers")
        if self.prompts_per_step % self.mini_batches:
            raise ValueError(
                f"prompts_per_step={self.prompts_per_step} is invalid: the PPO update splits each step's groups into "
                f"mini_batches={self.mini_batches} equal mini-batches, so use a multiple of {self.mini_batches}"
            )
        for name in ("temperature", "lr", "clip_ratio", "grad_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive number")
        if self.train_set is not None:
            self._check_train_set()

    def _check_train_set(self) -> None:
        """Refuse a fixed training set that cannot fill a step or that a level cannot supply; warn when
        the run is too short to visit each prompt :data:`MIN_EPOCHS` times."""
        if self.train_set < self.prompts_per_step:
            raise ValueError(
                f"train_set={self.train_set} is invalid: a step draws prompts_per_step={self.prompts_per_step} "
                f"distinct prompts from the set, so use at least {self.prompts_per_step}"
            )
        check_training_set(parse_levels(self.levels), self.train_set, self.eval_size, self.warm_up_share)
        draws = self.steps * self.prompts_per_step
        if draws // self.train_set < MIN_EPOCHS:
            fixes = [f"steps >= {-(-MIN_EPOCHS * self.train_set // self.prompts_per_step)}"]
            if draws // MIN_EPOCHS >= self.prompts_per_step:  # a smaller set must still fill a step
                fixes.insert(0, f"train_set <= {draws // MIN_EPOCHS}")
            warnings.warn(
                f"train_set={self.train_set} with steps={self.steps} x prompts_per_step={self.prompts_per_step} = "
                f"{draws} prompt draws visits each prompt {draws // self.train_set} time(s) at least, fewer than "
                f"{MIN_EPOCHS} epochs: use {' or '.join(fixes)}",
                stacklevel=4,  # past this method, __post_init__ and the dataclass's generated __init__
            )

    @property
    def lr_warmup_steps(self) -> int:
        """The steps of the rate's warm-up, as verl's actor counts them from lr_warmup_steps_ratio."""
        return int(self.lr_warmup_steps_ratio * self.steps)

    def to_dict(self) -> dict:
        return asdict(self)
