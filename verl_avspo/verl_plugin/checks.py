"""The launcher's config checks: what verl itself never checks, before any model or Ray starts.

Every check reports all of a config's problems at once (one :class:`ConfigCheckError`), each
message naming the key, the value and the fix. They come in two stages:

- :func:`settings_problems` needs no verl import (about a second): the group size, the rollout
  engine, every ``algorithm.avspo``, ``algorithm.dcpo`` and ``algorithm.intrinsic`` value, and
  how they combine with the trainer, the data and the policy loss. The launcher runs it first, so
  a typo is refused in seconds rather than after verl's imports.
- :func:`registry_problems` imports verl: the estimator, the policy loss and the V1 trainer mode
  against verl's registries, and verl's own ``validate_config``.

:func:`resource_problems` checks what the run will find on the machine: local data files, a local
model path, and whether the Ray cluster can supply the GPUs the config asks for (verl otherwise
waits for them); it also says what it could not check.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl_avspo.core.baselines import DCPOConfig, IntrinsicConfig, resolve_dcpo, resolve_intrinsic
from verl_avspo.core.config import AVSPOConfig, Problems, resolve_config

__all__ = [
    "ConfigCheckError",
    "HOOK_OVERRIDES",
    "SAMPLER_NAME",
    "SAMPLER_PATH",
    "hook_problems",
    "verl_package_dir",
    "is_group_estimator",
    "settings_problems",
    "registry_problems",
    "check_config",
    "check_prompt_indices",
    "verl_has_self_certainty",
    "resource_problems",
    "preflight",
]

logger = logging.getLogger(__name__)

# The ACR hook for stock verl (verl_avspo.verl_plugin.sampler) and what a user adds to a stock command line.
SAMPLER_PATH = "pkg://verl_avspo.verl_plugin.sampler"
SAMPLER_NAME = "ACRSampler"
HOOK_OVERRIDES = (
    f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
    f"trainer.v1.sampler.custom_sampler.name={SAMPLER_NAME}",
)

# Said when only the first stage ran, so that a user knows more may follow.
NOT_YET_CHECKED = (
    "Not yet checked, because verl is not imported until these are fixed: the estimator, policy-loss and trainer-mode "
    "names against verl's registries, verl's own validate_config, and the data files, model path and GPUs."
)


class ConfigCheckError(ValueError):
    """A config that cannot train. ``problems`` holds one message per problem; ``note`` says what
    was not checked."""

    def __init__(self, problems: list[str], note: str = ""):
        self.problems = list(problems)
        self.note = note
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems in the config:\n" + "\n".join(
                f"  {number}. {problem}" for number, problem in enumerate(self.problems, 1)
            )
        super().__init__(f"{text}\n{note}" if note else text)


def verl_package_dir() -> Path:
    """The installed verl's folder, found without importing verl (its ``__init__`` is the slow part)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed: pip install 'verl[verl-core]>=0.9.1,<0.10'")
    return Path(next(iter(spec.submodule_search_locations)))


def verl_has_self_certainty() -> bool:
    """Whether the installed verl's FSDP engine returns per-token self-certainty, i.e. carries
    patches/verl-0.9.1-intrinsic.patch. Reads the module's source file; imports nothing."""
    source = verl_package_dir() / "workers" / "engine" / "fsdp" / "transformer_impl.py"
    return source.is_file() and "calculate_self_certainty" in source.read_text(encoding="utf-8")


def is_group_estimator(name: str) -> bool:
    """Whether the registered estimator ``name`` normalises within prompt groups: verl passes the
    uid array only to estimators that take an ``index`` argument (grpo, rloo, avspo, ...)."""
    from verl.trainer.ppo import core_algos

    fn = core_algos.get_adv_estimator_fn(name)
    return "index" in inspect.signature(fn).parameters


def _filters_groups(algorithm: DictConfig) -> bool:
    """Whether DAPO's dynamic sampling (``algorithm.filter_groups``) is on."""
    filter_groups = algorithm.get("filter_groups", None)
    return filter_groups is not None and bool(filter_groups.get("enable", False))


def _sync_v1(config: DictConfig) -> bool:
    return bool(config.trainer.use_v1) and config.trainer.v1.trainer_mode == "sync"


def _rollout_problems(config: DictConfig) -> Iterator[str]:
    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        yield (
            f"actor_rollout_ref.rollout.n={n!r} is invalid: it is the number of responses sampled per prompt "
            "(the group size), a positive integer. Set actor_rollout_ref.rollout.n=8 (the paper's group size)."
        )
    required = ["actor_rollout_ref.rollout.name"]
    if config.reward.reward_model.enable:
        required.append("reward.reward_model.rollout.name")
    for key in required:
        if OmegaConf.select(config, key) is None:  # None also for verl's mandatory `???`
            yield f"{key} is required: set the rollout engine, for example {key}=vllm (or sglang)."


# verl settings that recipes set from the environment (LR=, N_GPUS=, ...) and that verl reads only
# once the models load: (key, integer?, lowest, lowest excluded?, highest).
_NUMBERS = (
    ("actor_rollout_ref.actor.optim.lr", False, 0.0, True, math.inf),
    ("actor_rollout_ref.rollout.temperature", False, 0.0, False, math.inf),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", False, 0.0, True, 1.0),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", True, 1, False, math.inf),
    ("data.train_batch_size", True, 1, False, math.inf),
    ("data.max_prompt_length", True, 1, False, math.inf),
    ("data.max_response_length", True, 1, False, math.inf),
    ("trainer.n_gpus_per_node", True, 1, False, math.inf),
    ("trainer.nnodes", True, 1, False, math.inf),
    ("trainer.total_epochs", True, 1, False, math.inf),
)


def _number_problems(config: DictConfig) -> Iterator[str]:
    """Text or out-of-range values where verl expects a number (a recipe's ``LR=abc``, ``N_GPUS=0``)."""
    for key, integer, low, low_open, high in _NUMBERS:
        value = OmegaConf.select(config, key, default=None)
        if value is None:
            continue
        kind = "an integer" if integer else "a number"
        is_number = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
        if not is_number or (value <= low if low_open else value < low) or value > high or value != value:
            bounds = f"> {low}" if low_open else f">= {low}"
            bounds += f" and <= {high}" if high != math.inf else ""
            yield (
                f"{key}={value!r} is invalid: expected {kind} {bounds}. Fix the value (in a recipe, its "
                "environment variable)."
            )


def _alert_problems(config: DictConfig, settings: AVSPOConfig) -> Iterator[str]:
    if settings.alert.action == "stop" and not config.trainer.use_v1:
        yield (
            "algorithm.avspo.alert.action=stop needs the V1 trainer; with trainer.use_v1=False the alert "
            "can only warn. Set trainer.use_v1=True or algorithm.avspo.alert.action=warn."
        )


def hook_problems(config: Any) -> list[str]:
    """Why the hook cannot measure ACR under ``config`` (verl's whole config); empty if it can."""
    problems = []
    if not config.trainer.use_v1:
        problems.append(
            "trainer.v1.sampler.custom_sampler (the ACR hook) is a V1 replay buffer, and trainer.use_v1=False runs "
            "the legacy trainer, which has none. Set trainer.use_v1=True, or use `python -m verl_avspo.main_ppo`, "
            "which logs ACR with the legacy trainer too."
        )
    reward_model = config.reward.reward_model
    if reward_model.enable and not reward_model.enable_resource_pool:
        problems.append(
            "the ACR hook (trainer.v1.sampler.custom_sampler) reads the reward loop's scores when it samples a batch, "
            "and a colocated reward model (reward.reward_model.enable=True, enable_resource_pool=False) scores only "
            "after sampling. Set reward.reward_model.enable_resource_pool=True, or train with `python -m "
            "verl_avspo.main_ppo`, which measures ACR at the advantage stage, after every reward."
        )
    return problems


def _uses_hook(config: DictConfig) -> bool:
    custom = OmegaConf.select(config, "trainer.v1.sampler.custom_sampler", default=None)
    return custom is not None and custom.get("path") == SAMPLER_PATH and custom.get("name") == SAMPLER_NAME


def _dcpo_clip_problems(value: Any) -> Iterator[str]:
    """``clip_ratio_c`` caps DCPO's upper ratio bound and dual-clips negative advantages."""
    try:
        cap = float(value)
    except (TypeError, ValueError):
        cap = float("nan")
    if not cap > 1:
        yield (
            f"actor_rollout_ref.actor.clip_ratio_c={value!r} is invalid with policy_loss.loss_mode=dcpo: it caps "
            "DCPO's upper ratio bound and dual-clips negative advantages, so it must be a number > 1. Set it to 10 "
            "(DCPO's)."
        )
    elif cap < 10:
        logger.warning(
            "actor_rollout_ref.actor.clip_ratio_c=%s with policy_loss.loss_mode=dcpo caps DCPO's upper ratio bound "
            "at %s; DCPO's released code uses 10 (verl's default is 3). Set actor_rollout_ref.actor.clip_ratio_c=10 "
            "to match it.",
            value,
            cap,
        )


def check_prompt_indices(train_files) -> None:
    """DCPO with ``prompt_key=index`` keys each prompt's history by its row's ``extra_info.index``:
    refuse local parquet train files in which it is missing, null or repeated (across all files),
    since verl's RLHFDataset would then give different prompts one history.

    Raises:
        ConfigCheckError: one problem per file (the first bad row of each).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if train_files is None:
        return
    files = [train_files] if isinstance(train_files, str) else [str(f) for f in train_files]
    fix = "Give every row a unique extra_info.index (recipes/data does), or set algorithm.dcpo.prompt_key=raw_prompt."
    first_seen: dict = {}
    problems: list[str] = []
    for name in dict.fromkeys(files):  # a file listed twice (upweighted) repeats its own prompts only
        path = Path(name).expanduser()
        if not (path.is_file() and path.suffix == ".parquet"):
            logger.warning(
                "cannot check extra_info.index of %s for DCPO here (not a local parquet file); during training only "
                "different prompts sharing an index within one batch are caught. If its indices may repeat, set "
                "algorithm.dcpo.prompt_key=raw_prompt.",
                name,
            )
            continue
        try:
            schema = pq.read_schema(path)
            info = schema.field("extra_info").type if "extra_info" in schema.names else None
            if info is not None and not isinstance(info, pa.StructType):
                problems.append(
                    f"algorithm.adv_estimator=dcpo: {name}'s extra_info column is {info}, but verl's RLHFDataset needs "
                    f"a struct (a dict per row) with an index field. {fix}"
                )
                continue
            if info is None or info.get_field_index("index") < 0:
                problems.append(
                    f"algorithm.adv_estimator=dcpo keys prompts by extra_info.index, but {name} has no "
                    f"extra_info.index column, so verl's RLHFDataset gives every row index 0 and DCPO would pool all "
                    f"prompts. {fix}"
                )
                continue
            column = pq.read_table(path, columns=["extra_info"]).column("extra_info").combine_chunks()
        except pa.ArrowException as err:
            problems.append(f"algorithm.adv_estimator=dcpo: cannot read {name} as parquet ({err}).")
            continue
        for row, index in enumerate(column.field("index").to_pylist()):
            if index is None:
                problems.append(
                    f"algorithm.adv_estimator=dcpo: row {row} of {name} has no extra_info.index (null). {fix}"
                )
                break
            if index in first_seen:
                where = first_seen[index]
                problems.append(
                    f"algorithm.adv_estimator=dcpo: extra_info.index {index!r} appears in row {where[1]} of "
                    f"{where[0]} and row {row} of {name}, so DCPO would pool two prompts' rewards. {fix}"
                )
                break
            first_seen[index] = (name, row)
    if problems:
        raise ConfigCheckError(problems)


def _baseline_problems(config: DictConfig, dcpo: DCPOConfig | None, intrinsic: IntrinsicConfig | None) -> Iterator[str]:
    """DCPO (estimator and policy loss) and the intrinsic rewards (INTUITOR, RENT), given their
    settings (None where the settings themselves were invalid)."""
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    estimator = algorithm.adv_estimator
    intrinsic_on = intrinsic is not None and intrinsic.enabled
    if OmegaConf.select(actor, "policy_loss.loss_mode", default="vanilla") == "dcpo":
        yield from _dcpo_clip_problems(actor.get("clip_ratio_c", 3.0))
    needs = []
    if estimator == "dcpo":
        needs.append("algorithm.adv_estimator=dcpo (its prompt identity is passed by our V1 trainer)")
    if intrinsic_on:
        needs.append(f"algorithm.intrinsic.reward={intrinsic.reward} (computed in our V1 trainer)")
    if needs and not _sync_v1(config):
        yield (
            f"{' and '.join(needs)} needs the V1 sync trainer; this config has trainer.use_v1="
            f"{config.trainer.use_v1}, trainer.v1.trainer_mode={config.trainer.v1.trainer_mode}. Set "
            "trainer.use_v1=True trainer.v1.trainer_mode=sync."
        )
    filtering = _filters_groups(algorithm)
    if intrinsic_on and filtering:
        yield (
            f"algorithm.intrinsic.reward={intrinsic.reward} with algorithm.filter_groups.enable=True: verl filters "
            "groups while sampling, on the verifier's reward, before our trainer replaces it by the intrinsic one, so "
            "this 'no verifier' baseline would train only on the groups the verifier kept. Set "
            "algorithm.filter_groups.enable=False."
        )
    if estimator == "dcpo" and filtering:
        logger.warning(
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so DCPO's "
            "per-prompt history never records those visits, the ones its smooth standardization is for; the "
            "DCPO paper trains without dynamic sampling."
        )
    if estimator == "dcpo" and dcpo is not None and dcpo.prompt_key == "index":
        if OmegaConf.select(config, "data.custom_cls.path", default=None):
            logger.warning(
                "data.custom_cls is set: its dataset may fill index its own way, so the train files' "
                "extra_info.index is not checked for DCPO; different prompts sharing an index within a batch are "
                "still refused during training"
            )
        else:
            try:
                check_prompt_indices(config.data.get("train_files", None))
            except ConfigCheckError as err:
                yield from err.problems
    if not intrinsic_on:
        return
    rollout_correction = algorithm.get("rollout_correction", None)
    if rollout_correction is not None and rollout_correction.get("bypass_mode", False):
        yield (
            f"algorithm.intrinsic.reward={intrinsic.reward} reads the old policy's per-token distribution "
            "statistics, which verl skips with algorithm.rollout_correction.bypass_mode=True (old log-probs are "
            "the rollout's). Set algorithm.rollout_correction.bypass_mode=False."
        )
    if intrinsic.reward != "self_certainty":
        return
    if not verl_has_self_certainty():
        yield (
            "algorithm.intrinsic.reward=self_certainty (INTUITOR) needs each token's mean log-probability over "
            "the vocabulary, which verl 0.9.1's actor does not return. Apply patches/verl-0.9.1-intrinsic.patch "
            "to verl (see patches/README.md), or use algorithm.intrinsic.reward=negative_entropy (RENT), which "
            "verl supports as is."
        )
    if str(actor.strategy) not in ("fsdp", "fsdp2"):
        yield (
            f"algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.actor.strategy={actor.strategy}: "
            "the intrinsic patch adds self-certainty to verl's FSDP engine only. Use strategy fsdp or fsdp2."
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        yield (
            "algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.model.use_fused_kernels=True: "
            "fused kernels never materialise the logits that self-certainty needs. Set it to False."
        )


def settings_problems(
    config: DictConfig,
) -> tuple[list[str], AVSPOConfig | None, DCPOConfig | None, IntrinsicConfig | None]:
    """The first stage, without importing verl: every problem, and the settings that resolved
    (None where a section was invalid)."""
    algorithm = config.algorithm
    problems = Problems()
    problems.messages.extend(_rollout_problems(config))
    problems.messages.extend(_number_problems(config))
    # The resolvers take verl's DictConfig sections as they are (they are mappings).
    settings = problems.check(resolve_config, algorithm.get("avspo", None))
    dcpo = problems.check(resolve_dcpo, algorithm.get("dcpo", None))
    intrinsic = problems.check(resolve_intrinsic, algorithm.get("intrinsic", None))
    if settings is not None:
        problems.messages.extend(_alert_problems(config, settings))
    if _uses_hook(config):
        problems.messages.extend(hook_problems(config))
    problems.messages.extend(_baseline_problems(config, dcpo, intrinsic))
    return problems.messages, settings, dcpo, intrinsic


def _estimator_problems(name: str) -> Iterator[str]:
    from verl.trainer.ppo import core_algos

    if name not in core_algos.ADV_ESTIMATOR_REGISTRY and name in ("avspo", "dcpo"):
        try:
            importlib.import_module("verl_avspo.verl_plugin.register")
        except Exception as err:  # the real error, which verl's entry-point loader would swallow
            yield (
                f"algorithm.adv_estimator={name} is unknown because the verl-avspo plugin failed to load: "
                f"{type(err).__name__}: {err}. Fix that error (run `verl-avspo doctor`), then retry."
            )
            return
    if name not in core_algos.ADV_ESTIMATOR_REGISTRY:
        known = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)
        close = difflib.get_close_matches(name.lower(), known, n=1)  # AVSPO -> avspo
        hint = f" Did you mean {close[0]!r}?" if close else ""
        yield (
            f"algorithm.adv_estimator={name!r} is not a registered advantage estimator.{hint} "
            f"Registered: {', '.join(known)}."
        )


def _trainer_mode_problems(config: DictConfig) -> Iterator[str]:
    """``trainer.v1.trainer_mode`` must be registered (verl looks it up only inside the TaskRunner)."""
    if not config.trainer.use_v1:
        return
    import verl.trainer.ppo.v1  # noqa: F401  (registers sync, colocate_async, separate_async)
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    mode = config.trainer.v1.trainer_mode
    if mode not in TRAINER_REGISTRY:
        close = difflib.get_close_matches(str(mode).lower(), list(TRAINER_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        yield (
            f"trainer.v1.trainer_mode={mode!r} is not a registered V1 trainer.{hint} Registered: "
            f"{', '.join(sorted(TRAINER_REGISTRY))}."
        )


def registry_problems(config: DictConfig) -> list[str]:
    """The second stage, which imports verl: the estimator and the policy loss must be registered,
    and a group estimator needs groups of at least 2."""
    from verl.trainer.ppo import core_algos

    problems = list(_estimator_problems(str(config.algorithm.adv_estimator)))
    estimator, n = str(config.algorithm.adv_estimator), config.actor_rollout_ref.rollout.n
    if not problems and isinstance(n, int) and n == 1 and is_group_estimator(estimator):
        problems.append(
            f"actor_rollout_ref.rollout.n={n} with algorithm.adv_estimator={estimator}: a group estimator "
            "compares the responses sampled for one prompt, so it needs at least 2 per prompt (with 1, every "
            "group is a singleton: verl gives it mean 0 and std 1, so its advantage is its raw score, with no "
            "baseline, and no group can collapse). Set actor_rollout_ref.rollout.n=8 (the paper's group size) or "
            "more."
        )
    problems.extend(_trainer_mode_problems(config))
    loss_mode = str(OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla"))
    if loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
        close = difflib.get_close_matches(loss_mode, list(core_algos.POLICY_LOSS_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss.{hint} "
            f"Registered: {', '.join(sorted(core_algos.POLICY_LOSS_REGISTRY))}."
        )
    return problems


def _verl_validate_problems(config: DictConfig) -> list[str]:
    """verl's own launcher-side validation (batch sizes, micro batches, ...), which needs no GPU.
    verl stops at its first complaint, so this gives at most one."""
    import hydra
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    try:
        auto_set_device(config)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        fix = f" Set it on the command line: {key}=<value>." if key else ""
        return [f"verl's config is incomplete: {str(err).splitlines()[0]}.{fix}"]
    except (AssertionError, ValueError, hydra.errors.InstantiationException) as err:
        return [f"verl's validate_config rejected the config: {err}"]
    except TypeError as err:  # verl's YAML is untyped, so text given for a number fails in its arithmetic
        where = traceback.extract_tb(err.__traceback__)[-1].line
        return [
            f"verl's validate_config failed on a value of the wrong type: {err} (at `{where}`). A numeric setting "
            "was given text: check the numbers in your overrides (batch sizes, trainer.nnodes, n_gpus_per_node)."
        ]
    return []


def _warn_about_combinations(config: DictConfig) -> None:
    """Settings that train, but not as a user may expect."""
    if config.algorithm.adv_estimator == "avspo" and _filters_groups(config.algorithm):
        logger.warning(
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so "
            "AVSPO sees (almost) none and rarely triggers; the logged acr/* rates are measured before filtering."
        )


_REMOTE = re.compile(r"^[a-z][a-z0-9+.-]*://")
# A Hugging Face hub id: "name" or "org/name", neither absolute nor relative-looking.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


def _path_problems(config: DictConfig, not_checked: list[str]) -> Iterator[str]:
    for key in ("data.train_files", "data.val_files"):
        for name in _listed(OmegaConf.select(config, key, default=None)):
            if _REMOTE.match(name):
                not_checked.append(f"{key} entry {name} (remote)")
            elif not Path(name).expanduser().exists():
                yield (
                    f"{key}: {name} does not exist. Fix the path, or write the data first (recipes/README.md, "
                    "recipes/data/prepare_math.py)."
                )
    for key in ("actor_rollout_ref.model.path", "reward.custom_reward_function.path"):
        name = OmegaConf.select(config, key, default=None)
        if name is None or Path(str(name)).expanduser().exists():
            continue
        name = str(name)
        if _REMOTE.match(name):  # pkg:// (a module), hdfs://, ...
            if not name.startswith("pkg://"):
                not_checked.append(f"{key}={name} (remote)")
        elif key.endswith("model.path") and _HUB_ID.match(name):
            not_checked.append(
                f"{key}={name} (a Hugging Face hub id: downloaded, or read from the HF cache, at launch)"
            )
        else:
            accepted = (
                "a hub id such as Qwen/Qwen2.5-0.5B is also accepted"
                if key.endswith("model.path")
                else "or name a module as pkg://package.module"
            )
            yield f"{key}={name} does not exist on this machine. Fix the path ({accepted})."


def _requested_gpus(config: DictConfig) -> int:
    """GPUs verl's resource pools ask for: the trainer's, plus a standalone reward model's."""
    total = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    reward = config.reward.reward_model
    if reward.get("enable", False) and reward.get("enable_resource_pool", False):
        total += int(reward.n_gpus_per_node) * int(reward.nnodes)
    return total


def _ray_address(config: DictConfig) -> str | None:
    address = OmegaConf.select(config, "ray_kwargs.ray_init.address", default=None) or os.environ.get("RAY_ADDRESS")
    return None if address == "local" else address  # "local" starts a new local cluster, as no address does


def cluster_gpus(config: DictConfig, *, connect: bool) -> tuple[float | None, str]:
    """The GPUs the run's Ray cluster offers, and where that number comes from; None if unknown.

    Without a Ray address, verl starts a local cluster with ``ray_kwargs.ray_init.num_gpus`` GPUs, or
    the ones Ray detects (``torch.cuda.device_count()``, which honours CUDA_VISIBLE_DEVICES). With an
    address, the cluster is asked only if ``connect`` (then disconnected, so that verl's own
    ``ray.init`` still applies its runtime_env).
    """
    import ray

    if ray.is_initialized():
        return ray.cluster_resources().get("GPU", 0.0), "the running Ray cluster"
    address = _ray_address(config)
    if address:
        if not connect:
            return None, f"the Ray cluster at {address}"
        ray.init(address=address, logging_level=logging.WARNING)
        try:
            return ray.cluster_resources().get("GPU", 0.0), f"the Ray cluster at {address}"
        finally:
            ray.shutdown()
    num_gpus = OmegaConf.select(config, "ray_kwargs.ray_init.num_gpus", default=None)
    if num_gpus is not None:
        return float(num_gpus), f"ray_kwargs.ray_init.num_gpus={num_gpus}"
    import torch

    return float(torch.cuda.device_count()), "this machine (torch.cuda.device_count())"


def _gpu_problems(config: DictConfig, not_checked: list[str], *, connect: bool) -> Iterator[str]:
    device = str(OmegaConf.select(config, "trainer.device", default="cuda"))
    if device != "cuda":
        not_checked.append(f"the {device} devices the run needs (trainer.device={device})")
        return
    try:
        wanted = _requested_gpus(config)
    except (TypeError, ValueError):  # text for a number: reported by the settings stage
        return
    available, source = cluster_gpus(config, connect=connect)
    if available is None:
        not_checked.append(f"that {source} has the {wanted} GPU(s) the config asks for")
        return
    if available < wanted:
        nodes = int(config.trainer.nnodes)
        yield (
            f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node} x trainer.nnodes={nodes} asks for {wanted} "
            f"GPU(s), but {source} has {available:g}; Ray would wait for them and the run would hang. Set "
            "trainer.n_gpus_per_node (recipes: N_GPUS) to the GPUs you have"
            + (", or start a Ray cluster of those nodes and set ray_kwargs.ray_init.address" if nodes > 1 else "")
            + "."
        )


def resource_problems(config: DictConfig, *, connect: bool = False) -> tuple[list[str], list[str]]:
    """What the run will find: local data files and model path, and the GPUs of its Ray cluster.

    Returns:
        (problems, not checked): each problem names the key and the fix; "not checked" lists what
        could not be checked here (remote files, hub ids, an existing cluster when not ``connect``).
    """
    not_checked: list[str] = []
    problems = list(_path_problems(config, not_checked))
    problems += _gpu_problems(config, not_checked, connect=connect)
    return problems, not_checked


def check_config(config: DictConfig, *, verl_validate: bool = False) -> AVSPOConfig:
    """Both stages of our checks (and verl's ``validate_config`` with ``verl_validate``). Returns the
    resolved AVSPO settings (used for the stagnation alert on every run, and for the estimator when
    it is ``avspo``).

    Raises:
        ConfigCheckError: listing every problem found, each naming the key, the value and the fix.
    """
    problems, settings, _, _ = settings_problems(config)
    problems += registry_problems(config)
    if verl_validate:
        problems += _verl_validate_problems(config)
    if problems:
        raise ConfigCheckError(problems)
    _warn_about_combinations(config)
    return settings


def preflight(config: DictConfig) -> AVSPOConfig:
    """Everything checked before Ray starts: ours, then verl's, reported together."""
    return check_config(config, verl_validate=True)
