"""Launcher: verl's PPO trainer with ACR metrics, the stagnation alert and AVSPO state in checkpoints.

    python -m verl_avspo.main_ppo <hydra overrides>            # train
    python -m verl_avspo.main_ppo --dry-run <hydra overrides>  # check the config, start nothing
    python -m verl_avspo.main_ppo --cfg job <hydra overrides>  # print the composed config (Hydra)

The config is ``verl_avspo/config/avspo_trainer.yaml``: verl's ``ppo_trainer`` plus every
``algorithm.avspo.*`` key, with ``algorithm.adv_estimator=avspo``. Before Ray starts, the launcher
checks what verl itself never checks (the estimator name, the group size, the AVSPO settings) and
runs verl's own ``validate_config``; every failure exits with a message that says what to change.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import hydra
import ray
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.main_ppo_v0 import TaskRunner as LegacyTaskRunner
from verl.trainer.ppo import core_algos

from verl_avspo.baselines import DCPOConfig, IntrinsicConfig, dcpo_settings, intrinsic_settings
from verl_avspo.config import AVSPOConfig

__all__ = [
    "CONFIG_DIR",
    "CONFIG_NAME",
    "ConfigCheckError",
    "AVSPOTaskRunner",
    "AVSPOLegacyTaskRunner",
    "compose_config",
    "is_group_estimator",
    "check_config",
    "check_baselines",
    "verl_has_self_certainty",
    "preflight",
    "main",
]

logger = logging.getLogger(__name__)

# An absolute path: ``verl_avspo.config`` is a Python module, so Hydra cannot address this
# folder as a package (``pkg://``).
CONFIG_DIR = str(Path(__file__).resolve().parent / "config")
CONFIG_NAME = "avspo_trainer"


class ConfigCheckError(ValueError):
    """A config that cannot train; the message says what to change."""


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """Our config composed with verl's, as ``python -m verl_avspo.main_ppo`` would see it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def _check_estimator(name: str) -> None:
    if name in core_algos.ADV_ESTIMATOR_REGISTRY:
        return
    if name in ("avspo", "dcpo"):
        try:
            importlib.import_module("verl_avspo.register")
        except Exception as err:  # the real error, which verl's entry-point loader would swallow
            raise ConfigCheckError(
                f"algorithm.adv_estimator={name} is unknown because the verl-avspo plugin failed to load: "
                f"{type(err).__name__}: {err}. Fix that error (run `verl-avspo doctor`), then retry."
            ) from err
        if name in core_algos.ADV_ESTIMATOR_REGISTRY:
            return
    known = sorted(core_algos.ADV_ESTIMATOR_REGISTRY)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigCheckError(
        f"algorithm.adv_estimator={name!r} is not a registered advantage estimator.{hint} "
        f"Registered: {', '.join(known)}."
    )


def is_group_estimator(name: str) -> bool:
    """Whether the registered estimator ``name`` normalises within prompt groups: verl passes the
    uid array only to estimators that take an ``index`` argument (grpo, rloo, avspo, ...)."""
    fn = core_algos.get_adv_estimator_fn(name)
    return "index" in inspect.signature(fn).parameters


def _filters_groups(algorithm: DictConfig) -> bool:
    """Whether DAPO's dynamic sampling (``algorithm.filter_groups``) is on."""
    filter_groups = algorithm.get("filter_groups", None)
    return filter_groups is not None and bool(filter_groups.get("enable", False))


def check_config(config: DictConfig) -> AVSPOConfig:
    """The checks verl does not make, cheapest first. Returns the resolved AVSPO settings (used
    for the stagnation alert on every run, and for the estimator when it is ``avspo``).

    Raises:
        ConfigCheckError: naming the key, the value and the fix.
    """
    algorithm = config.algorithm
    estimator = str(algorithm.adv_estimator)
    _check_estimator(estimator)
    from verl_avspo.register import avspo_settings  # only now: a broken plugin gets the message above

    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigCheckError(
            f"actor_rollout_ref.rollout.n={n!r} is invalid: it is the number of responses sampled per prompt "
            "(the group size), a positive integer. Set actor_rollout_ref.rollout.n=8 (the paper's group size)."
        )
    if is_group_estimator(estimator) and n < 2:
        raise ConfigCheckError(
            f"actor_rollout_ref.rollout.n={n} with algorithm.adv_estimator={estimator}: a group estimator "
            "compares the responses sampled for one prompt, so it needs at least 2 per prompt (with 1, every "
            "advantage is 0). Set actor_rollout_ref.rollout.n=8 (the paper's group size) or more."
        )
    required = ["actor_rollout_ref.rollout.name"]
    if config.reward.reward_model.enable:
        required.append("reward.reward_model.rollout.name")
    for key in required:
        if OmegaConf.select(config, key) is None:  # None also for verl's mandatory `???`
            raise ConfigCheckError(f"{key} is required: set the rollout engine, for example {key}=vllm (or sglang).")
    try:
        settings = avspo_settings(algorithm)
    except ValueError as err:
        raise ConfigCheckError(str(err)) from err
    mode = config.trainer.v1.trainer_mode
    if settings.alert.action == "stop" and not config.trainer.use_v1:
        raise ConfigCheckError(
            "algorithm.avspo.alert.action=stop needs the V1 trainer; with trainer.use_v1=False the alert "
            "can only warn. Set trainer.use_v1=True or algorithm.avspo.alert.action=warn."
        )
    if settings.alert.action == "stop" and mode != "sync":
        raise ConfigCheckError(
            f"algorithm.avspo.alert.action=stop needs trainer.v1.trainer_mode=sync: the {mode} trainer is verl's "
            "own, without ACR metrics or the alert, so the run would never stop. Set trainer.v1.trainer_mode=sync "
            "or algorithm.avspo.alert.action=warn."
        )
    if config.trainer.use_v1 and mode != "sync":
        logger.warning(
            "trainer.v1.trainer_mode=%s: the launcher adds ACR metrics, the stagnation alert and AVSPO checkpoint "
            "state to the sync trainer only; this run trains with verl's own %s trainer.",
            mode,
            mode,
        )
    if estimator == "avspo" and _filters_groups(algorithm):
        logger.warning(
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so "
            "AVSPO sees (almost) none and rarely triggers; the logged acr/* rates are measured before filtering."
        )
    check_baselines(config)
    return settings


def verl_has_self_certainty() -> bool:
    """Whether the installed verl's FSDP engine returns per-token self-certainty, i.e. carries
    patches/verl-0.9.1-intrinsic.patch. Reads the module's source file; imports nothing."""
    spec = importlib.util.find_spec("verl.workers.engine.fsdp.transformer_impl")
    if spec is None or spec.origin is None:
        return False
    return "calculate_self_certainty" in Path(spec.origin).read_text(encoding="utf-8")


def _check_dcpo_clip(value) -> None:
    """``clip_ratio_c`` caps DCPO's upper ratio bound and dual-clips negative advantages."""
    try:
        cap = float(value)
    except (TypeError, ValueError):
        cap = float("nan")
    if not cap > 1:
        raise ConfigCheckError(
            f"actor_rollout_ref.actor.clip_ratio_c={value!r} is invalid with policy_loss.loss_mode=dcpo: it caps "
            "DCPO's upper ratio bound and dual-clips negative advantages, so it must be a number > 1. Set it to 10 "
            "(DCPO's)."
        )
    if cap < 10:
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
    since verl's RLHFDataset would then give different prompts one history."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if train_files is None:
        return
    files = [train_files] if isinstance(train_files, str) else [str(f) for f in train_files]
    fix = "Give every row a unique extra_info.index (recipes/data does), or set algorithm.dcpo.prompt_key=raw_prompt."
    first_seen: dict = {}
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
                raise ConfigCheckError(
                    f"algorithm.adv_estimator=dcpo: {name}'s extra_info column is {info}, but verl's RLHFDataset needs "
                    f"a struct (a dict per row) with an index field. {fix}"
                )
            if info is None or info.get_field_index("index") < 0:
                raise ConfigCheckError(
                    f"algorithm.adv_estimator=dcpo keys prompts by extra_info.index, but {name} has no "
                    f"extra_info.index column, so verl's RLHFDataset gives every row index 0 and DCPO would pool all "
                    f"prompts. {fix}"
                )
            column = pq.read_table(path, columns=["extra_info"]).column("extra_info").combine_chunks()
        except pa.ArrowException as err:
            raise ConfigCheckError(f"algorithm.adv_estimator=dcpo: cannot read {name} as parquet ({err}).") from err
        for row, index in enumerate(column.field("index").to_pylist()):
            if index is None:
                raise ConfigCheckError(
                    f"algorithm.adv_estimator=dcpo: row {row} of {name} has no extra_info.index (null). {fix}"
                )
            if index in first_seen:
                where = first_seen[index]
                raise ConfigCheckError(
                    f"algorithm.adv_estimator=dcpo: extra_info.index {index!r} appears in row {where[1]} of "
                    f"{where[0]} and row {row} of {name}, so DCPO would pool two prompts' rewards. {fix}"
                )
            first_seen[index] = (name, row)


def check_baselines(config: DictConfig) -> tuple[DCPOConfig, IntrinsicConfig]:
    """The checks of DCPO (estimator and policy loss) and of the intrinsic rewards (INTUITOR, RENT).

    Raises:
        ConfigCheckError: naming the key, the value and the fix.
    """
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    try:
        dcpo, intrinsic = dcpo_settings(algorithm), intrinsic_settings(algorithm)
    except ValueError as err:
        raise ConfigCheckError(str(err)) from err
    loss_mode = str(OmegaConf.select(actor, "policy_loss.loss_mode", default="vanilla"))
    if loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
        close = difflib.get_close_matches(loss_mode, list(core_algos.POLICY_LOSS_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigCheckError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss.{hint} "
            f"Registered: {', '.join(sorted(core_algos.POLICY_LOSS_REGISTRY))}."
        )
    if loss_mode == "dcpo":
        _check_dcpo_clip(actor.get("clip_ratio_c", 3.0))
    needs = []
    if algorithm.adv_estimator == "dcpo":
        needs.append("algorithm.adv_estimator=dcpo (its prompt identity is passed by our V1 trainer)")
    if intrinsic.enabled:
        needs.append(f"algorithm.intrinsic.reward={intrinsic.reward} (computed in our V1 trainer)")
    if needs and not (config.trainer.use_v1 and config.trainer.v1.trainer_mode == "sync"):
        raise ConfigCheckError(
            f"{' and '.join(needs)} needs the V1 sync trainer; this config has trainer.use_v1="
            f"{config.trainer.use_v1}, trainer.v1.trainer_mode={config.trainer.v1.trainer_mode}. Set "
            "trainer.use_v1=True trainer.v1.trainer_mode=sync."
        )
    filtering = _filters_groups(algorithm)
    if intrinsic.enabled and filtering:
        raise ConfigCheckError(
            f"algorithm.intrinsic.reward={intrinsic.reward} with algorithm.filter_groups.enable=True: verl filters "
            "groups while sampling, on the verifier's reward, before our trainer replaces it by the intrinsic one, so "
            "this 'no verifier' baseline would train only on the groups the verifier kept. Set "
            "algorithm.filter_groups.enable=False."
        )
    if algorithm.adv_estimator == "dcpo" and filtering:
        logger.warning(
            "algorithm.filter_groups.enable=True removes collapsed groups before the advantage stage, so DCPO's "
            "per-prompt history never records those visits, the ones its smooth standardization is for; the "
            "DCPO paper trains without dynamic sampling."
        )
    if algorithm.adv_estimator == "dcpo" and dcpo.prompt_key == "index":
        if OmegaConf.select(config, "data.custom_cls.path", default=None):
            logger.warning(
                "data.custom_cls is set: its dataset may fill index its own way, so the train files' "
                "extra_info.index is not checked for DCPO; different prompts sharing an index within a batch are "
                "still refused during training"
            )
        else:
            check_prompt_indices(config.data.get("train_files", None))
    if intrinsic.enabled:
        rollout_correction = algorithm.get("rollout_correction", None)
        if rollout_correction is not None and rollout_correction.get("bypass_mode", False):
            raise ConfigCheckError(
                f"algorithm.intrinsic.reward={intrinsic.reward} reads the old policy's per-token distribution "
                "statistics, which verl skips with algorithm.rollout_correction.bypass_mode=True (old log-probs are "
                "the rollout's). Set algorithm.rollout_correction.bypass_mode=False."
            )
    if intrinsic.reward == "self_certainty":
        if not verl_has_self_certainty():
            raise ConfigCheckError(
                "algorithm.intrinsic.reward=self_certainty (INTUITOR) needs each token's mean log-probability over "
                "the vocabulary, which verl 0.9.1's actor does not return. Apply patches/verl-0.9.1-intrinsic.patch "
                "to verl (see patches/README.md), or use algorithm.intrinsic.reward=negative_entropy (RENT), which "
                "verl supports as is."
            )
        if str(actor.strategy) not in ("fsdp", "fsdp2"):
            raise ConfigCheckError(
                f"algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.actor.strategy={actor.strategy}: "
                "the intrinsic patch adds self-certainty to verl's FSDP engine only. Use strategy fsdp or fsdp2."
            )
        if config.actor_rollout_ref.model.get("use_fused_kernels", False):
            raise ConfigCheckError(
                "algorithm.intrinsic.reward=self_certainty with actor_rollout_ref.model.use_fused_kernels=True: "
                "fused kernels never materialise the logits that self-certainty needs. Set it to False."
            )
    return dcpo, intrinsic


def _verl_validate(config: DictConfig) -> None:
    """verl's own launcher-side validation (batch sizes, micro batches, ...), which needs no GPU."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    try:
        auto_set_device(config)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        fix = f" Set it on the command line: {key}=<value>." if key else ""
        raise ConfigCheckError(f"verl's config is incomplete: {str(err).splitlines()[0]}.{fix}") from err
    except (AssertionError, ValueError, hydra.errors.InstantiationException) as err:
        raise ConfigCheckError(f"verl's validate_config rejected the config: {err}") from err
    except TypeError as err:  # verl's YAML is untyped, so text given for a number fails in its arithmetic
        where = traceback.extract_tb(err.__traceback__)[-1].line
        raise ConfigCheckError(
            f"verl's validate_config failed on a value of the wrong type: {err} (at `{where}`). A numeric setting "
            "was given text: check the numbers in your overrides (batch sizes, trainer.nnodes, n_gpus_per_node)."
        ) from err


def preflight(config: DictConfig) -> AVSPOConfig:
    """Everything checked before Ray starts: ours, then verl's."""
    settings = check_config(config)
    _verl_validate(config)
    return settings


def _describe(config: DictConfig, settings: AVSPOConfig) -> str:
    trainer = f"V1 {config.trainer.v1.trainer_mode}" if config.trainer.use_v1 else "legacy (use_v1=False)"
    lines = [
        f"algorithm.adv_estimator={config.algorithm.adv_estimator}  "
        f"actor_rollout_ref.rollout.n={config.actor_rollout_ref.rollout.n}  trainer={trainer}",
        "AVSPO settings (algorithm.avspo, resolved):",
    ]
    for key, value in settings.to_dict().items():
        lines.append(f"  {key}: {value}")
    dcpo, intrinsic = dcpo_settings(config.algorithm), intrinsic_settings(config.algorithm)
    if config.algorithm.adv_estimator == "dcpo":
        lines.append(
            "DCPO settings (algorithm.dcpo, resolved): " + ", ".join(f"{k}={v}" for k, v in dcpo.to_dict().items())
        )
    if intrinsic.enabled:
        lines.append(
            "intrinsic reward (algorithm.intrinsic, resolved): "
            + ", ".join(f"{k}={v}" for k, v in intrinsic.to_dict().items())
        )
    loss_mode = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    lines.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}")
    return "\n".join(lines)


@ray.remote
class AVSPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 TaskRunner with our ``PPOTrainerSync`` subclass installed under the mode ``sync``.

    The swap happens inside the actor, where the trainer is built; the mode name stays ``sync``
    because verl compares it literally in several places.
    """

    def run(self, config: DictConfig):
        from verl_avspo.trainer import install_sync_trainer

        install_sync_trainer()
        return super().run(config)


@ray.remote
class AVSPOLegacyTaskRunner(LegacyTaskRunner.__ray_actor_class__):
    """verl's legacy TaskRunner (``trainer.use_v1=False``) building our ``RayPPOTrainer`` subclass."""

    def run(self, config: DictConfig):
        from verl_avspo.trainer import install_legacy_trainer

        install_legacy_trainer()
        return super().run(config)


def _fail(err: ConfigCheckError) -> None:
    print(f"verl-avspo: {err}", file=sys.stderr)
    raise SystemExit(1)


def train(config: DictConfig) -> None:
    """Check ``config``, log the AVSPO settings once, then run verl's PPO with our TaskRunner."""
    try:
        settings = preflight(config)
    except ConfigCheckError as err:
        _fail(err)
    logger.info("verl-avspo launcher\n%s", _describe(config, settings))
    runner = AVSPOTaskRunner if config.trainer.use_v1 else AVSPOLegacyTaskRunner
    run_ppo(config, task_runner_class=runner)


def dry_run(overrides: Sequence[str]) -> int:
    """Compose the config, run every check, print the AVSPO settings; start nothing."""
    from hydra.errors import HydraException

    try:
        config = compose_config(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        cause = f" ({str(err.__cause__).splitlines()[0]})" if err.__cause__ else ""
        print(f"verl-avspo: invalid override: {err}{cause}", file=sys.stderr)
        return 1
    try:
        settings = preflight(config)
    except ConfigCheckError as err:
        print(f"verl-avspo: {err}", file=sys.stderr)
        return 1
    print(_describe(config, settings))
    print("OK: the config composes and passes verl-avspo's and verl's checks (dry run: nothing was started)")
    return 0


@hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)
def _hydra_main(config: DictConfig) -> None:
    train(config)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:  # our usage first: Hydra's help knows nothing of --dry-run
        print(__doc__.split("\n\n")[1] + "\n\nverl's config (Hydra's help follows):\n")
    if "--dry-run" in argv:
        overrides = [arg for arg in argv if arg != "--dry-run"]
        flags = [arg for arg in overrides if arg.startswith("-")]
        if flags:  # Hydra's own flags need Hydra's own run
            print(
                f"verl-avspo: --dry-run takes Hydra overrides (key=value) only, not {' '.join(flags)}. "
                "Use `python -m verl_avspo.main_ppo --cfg job <overrides>` to print the composed config, "
                "`--help` for verl's config.",
                file=sys.stderr,
            )
            return 2
        return dry_run(overrides)
    sys.argv = [sys.argv[0], *argv]  # Hydra parses sys.argv (overrides, --cfg, --multirun, ...)
    _hydra_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
