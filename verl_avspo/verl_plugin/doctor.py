"""``verl-avspo doctor``: is the plugin installed so that every verl process sees ``avspo``?

verl swallows import errors of ``verl.plugins`` entry points (at DEBUG level), so a broken install
shows up only as ``Unknown advantage estimator`` after models have loaded. This command makes each
link of the chain visible: versions, the entry point itself, a fresh ``import verl`` process, a Ray
actor (where verl's TaskRunner computes advantages; on a cluster set ``RAY_ADDRESS`` to check the
cluster's workers), the launcher's config, our trainer for stock ``main_ppo`` (its modes in verl's trainer
registry, and the override that chooses it; given the user's overrides, those composed with verl's config and
checked as the launcher checks them: a misspelt mode, our keys without ``+``, a bad allocator value), the
paper's other baselines (the ``dcpo`` registrations; whether verl carries the patch INTUITOR needs), and TRL when it is
installed (its
version against the TRL adapter's tested range, ``GRPOTrainer`` and the adapter importable, and
whether verl can build models next to it: the entry point's TRL guard). Exit status 1 if any check
fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence


def registered_by() -> str:
    """What a verl worker sees after a plain ``import verl``: run in a fresh interpreter and in a
    Ray actor. (This module imports nothing from the plugin, so it cannot register it itself.)"""
    import verl  # noqa: F401  (loads the verl.plugins entry points)
    from verl.trainer.ppo import core_algos

    fn = core_algos.ADV_ESTIMATOR_REGISTRY.get("avspo")
    return f"registered by {fn.__module__}" if fn else "not registered"


_PROBE = "from verl_avspo.verl_plugin.doctor import registered_by; print(registered_by())"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray actor check (it starts a local Ray)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="your stock main_ppo overrides, all of them: composed with verl's config as main_ppo composes them and "
        "checked as `python -m verl_avspo.main_ppo` checks a config (our keys, given with +; the trainer mode; the "
        "estimator; the classes and functions they name; the run state a resume reads), without data, model or GPUs",
    )


def _versions() -> str:
    found = []
    for package in ("verl", "torch", "ray", "vllm", "sglang", "verl-avspo"):
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            if package in ("verl", "torch", "ray"):
                raise RuntimeError(f"{package} is not installed") from None
    return ", ".join(found)


def _entry_point() -> str:
    points = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "avspo"]
    if not points:
        raise RuntimeError(
            "no `avspo` entry point in group verl.plugins: reinstall verl-avspo (pip install -e .) in this environment"
        )
    module = points[0].load()
    return f"{points[0].value} loads ({module.__file__})"


def _plugin_policy_problem() -> str | None:
    """Why verl would not load the entry point at all, from this environment's variables: verl's
    ``VERL_USE_EXTERNAL_PLUGINS`` (``auto``, ``none`` or a list of entry-point names), unless
    ``VERL_USE_EXTERNAL_MODULES`` imports the plugin anyway."""
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    modules = os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    if policy == "auto" or "verl_avspo" in modules:
        return None
    names = {name.strip() for name in policy.split(",") if name.strip()}
    if policy != "none" and "avspo" in names:
        return None
    given = os.environ["VERL_USE_EXTERNAL_PLUGINS"]
    return (
        f"VERL_USE_EXTERNAL_PLUGINS={given} tells verl not to load the `avspo` entry point "
        f"({'no plugin at all' if policy == 'none' else 'only ' + ', '.join(sorted(names))}). Unset it (or set it to "
        "auto, or add avspo to its list), or set VERL_USE_EXTERNAL_MODULES=verl_avspo.verl_plugin.register"
    )


def _fresh_process() -> str:
    # The environment as it is: VERL_USE_EXTERNAL_PLUGINS / _MODULES decide what verl loads there too.
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.returncode != 0 or not answer.startswith("registered"):
        cause = _plugin_policy_problem()
        if cause:
            raise RuntimeError(f"{answer}: {cause}")
        raise RuntimeError(f"{answer or 'the probe failed'}\n{result.stderr.strip()[-2000:]}")
    return answer


def _ray_actor() -> str:
    import ray

    started = not ray.is_initialized()
    if started and os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)  # the user's cluster: check its workers
    elif started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=1)
        class Probe:
            def check(self) -> str:
                return registered_by()

        probe = Probe.remote()
        answer = ray.get(probe.check.remote(), timeout=300)
        ray.kill(probe)
    finally:
        if started:
            ray.shutdown()
    if not answer.startswith("registered"):
        cause = _plugin_policy_problem()
        if cause and not os.environ.get("RAY_ADDRESS"):  # a local Ray inherits this environment
            raise RuntimeError(f"{answer} in a Ray actor: {cause}")
        raise RuntimeError(
            f"{answer} in a Ray actor: the cluster's Python lacks the plugin. Install verl-avspo there, or set "
            "VERL_USE_EXTERNAL_MODULES=verl_avspo.verl_plugin.register via ray_kwargs.ray_init.runtime_env.env_vars"
        )
    return answer + " (in a Ray actor)"


def _config() -> str:
    from verl_avspo.verl_plugin.launcher import CONFIG_DIR, CONFIG_NAME, compose_config
    from verl_avspo.verl_plugin.settings import parse_settings

    config = compose_config()
    settings = parse_settings(config.algorithm)
    return (
        f"{CONFIG_DIR}/{CONFIG_NAME}.yaml composes with verl's ppo_trainer "
        f"(adv_estimator={config.algorithm.adv_estimator}, preset={settings.avspo.preset})"
    )


def _baselines() -> str:
    """The paper's other baselines in this process: DCPO's estimator and loss, and whether verl
    carries the patch INTUITOR needs (informational: RENT and DCPO need no patch)."""
    from verl.trainer.ppo import core_algos

    from verl_avspo.verl_plugin.checks.resources import verl_has_self_certainty
    from verl_avspo.verl_plugin.register import DCPO_NAME, compute_dcpo_advantage, compute_dcpo_policy_loss

    ours = {"estimator": compute_dcpo_advantage.__module__, "loss": compute_dcpo_policy_loss.__module__}
    for registry, what in ((core_algos.ADV_ESTIMATOR_REGISTRY, "estimator"), (core_algos.POLICY_LOSS_REGISTRY, "loss")):
        owner = getattr(registry.get(DCPO_NAME), "__module__", None)
        if owner is None:
            raise RuntimeError(
                f"no {DCPO_NAME!r} {what} is registered: verl_avspo.verl_plugin.register did not run in this "
                "process (see the entry-point check above; reinstall with pip install -e .)"
            )
        if owner != ours[what]:
            raise RuntimeError(
                f"the {DCPO_NAME!r} {what} is registered by {owner}, not {ours[what]}: another plugin took the name "
                "first; remove or rename its registration"
            )
    intuitor = (
        "verl carries patches/verl-0.9.1-intrinsic.patch"
        if verl_has_self_certainty()
        else "needs patches/verl-0.9.1-intrinsic.patch, not applied to this verl"
    )
    return f"dcpo estimator and policy loss registered; RENT needs no patch; INTUITOR {intuitor}"


# The sections of verl's config that only verl-avspo reads: stock main_ppo's config (verl's ppo_trainer) lacks them.
_OUR_SECTIONS = ("algorithm.acr", "algorithm.avspo", "algorithm.prompts", "algorithm.dcpo", "algorithm.intrinsic")


def _stock_config(overrides: Sequence[str]):
    """verl's ``ppo_trainer`` composed with ``overrides`` as stock ``main_ppo``'s Hydra composes it (its YAML read
    from its folder, verl not imported).

    Raises:
        RuntimeError: an override Hydra refuses, naming it and the fix (for our keys without ``+``: the ``+``).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from verl_avspo.verl_plugin.checks import verl_package_dir

    unplussed = [arg for arg in overrides if arg.partition("=")[0].startswith(_OUR_SECTIONS)]
    if unplussed:
        sections = ", ".join(sorted({".".join(arg.split(".")[:2]) for arg in unplussed}))
        them = "it" if len(unplussed) == 1 else "them"
        raise RuntimeError(
            f"{' '.join(unplussed)}: stock main_ppo's config (verl's ppo_trainer) has no {sections}, so Hydra would "
            f"refuse {them} before training. Write {them} with a +: {' '.join('+' + arg for arg in unplussed)} (or "
            "launch with `python -m verl_avspo.main_ppo`, whose config declares them)"
        )
    try:
        with initialize_config_dir(config_dir=str(verl_package_dir() / "trainer" / "config"), version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        cause = f" ({str(err.__cause__).splitlines()[0]})" if err.__cause__ else ""
        raise RuntimeError(f"stock main_ppo's Hydra would refuse these overrides: {err}{cause}") from None


def _stock_route(overrides: Sequence[str] = ()) -> str:
    """Our trainers for stock ``main_ppo``: in verl's trainer registry after ``import verl`` (as verl's TaskRunner
    looks them up), and the override that chooses them. With ``overrides`` (the user's stock command line), they
    are composed with verl's config as ``main_ppo`` composes them and checked as the launcher checks a config
    (every verl-avspo setting, the trainer mode, the estimator and loss names, the classes and functions they
    name, the run state a resume would read), without the data, the model or the GPUs."""
    import verl  # noqa: F401  (loads the verl.plugins entry points)
    from verl.trainer.ppo.v1 import trainer_base

    from verl_avspo.verl_plugin.checks import ConfigCheckError, check_config
    from verl_avspo.verl_plugin.checks.checkpoint_folder import resume_state_problems
    from verl_avspo.verl_plugin.checks.extern import extern_object_problems
    from verl_avspo.verl_plugin.run_state import before_rollout_problem
    from verl_avspo.verl_plugin.settings import parse_settings
    from verl_avspo.verl_plugin.trainer_modes import MODE_KEY, MODE_OVERRIDE, MODES

    missing = [mode for mode in MODES if mode not in trainer_base.TRAINER_REGISTRY]
    if missing:
        cause = _plugin_policy_problem() or "see the warning above for why verl_avspo.verl_plugin.trainer_v1 failed"
        raise RuntimeError(f"trainer.v1.trainer_mode={'/'.join(missing)} is not in verl's trainer registry: {cause}")
    others = ", ".join(mode for mode in MODES if mode not in MODE_OVERRIDE)
    ready = f"ACR in stock `python -m verl.trainer.main_ppo` (V1): add {MODE_OVERRIDE} (or {others})"
    if not overrides:
        return ready
    names_mode = any(arg.lstrip("+").partition("=")[0] == MODE_KEY for arg in overrides)
    config = _stock_config(list(overrides) if names_mode else [MODE_OVERRIDE, *overrides])  # the mode to add
    try:
        problems = []
        check_config(config)
    except ConfigCheckError as err:
        problems = err.problems
    problems += extern_object_problems(config) + resume_state_problems(config)
    if not names_mode:  # verl's own trainer runs, which never skips or allocates
        try:
            problems += filter(None, [before_rollout_problem(parse_settings(config.algorithm).prompts)])
        except ValueError:
            pass  # a bad algorithm.prompts value: check_config named it
    if problems:
        raise RuntimeError(" ".join(problems) if len(problems) == 1 else str(ConfigCheckError(problems)))
    return f"{ready}; your overrides compose with verl's config and pass verl-avspo's checks"


def _verl_next_to_trl() -> str:
    """What verl's model set-up does with this TRL's value-head class (docs/troubleshooting.md, "verl
    next to TRL"), judged in this process, where verl's plugins were loaded as in a worker."""
    import verl  # noqa: F401  (loads the verl.plugins entry points, and with them the guard)
    import verl.models.transformers.monkey_patch as monkey_patch

    from verl_avspo.verl_plugin import trl_guard

    state = trl_guard.state(check_trl=True)
    if importlib.util.find_spec("trl") is None:
        return "TRL is not installed, so verl never looks for it"
    if not hasattr(monkey_patch, "is_trl_available"):
        return "verl imports it only for a value-head critic (verl carries patches/02), so the guard is idle"
    if state.trl_without_value_head is None:
        return "TRL has it, so verl's own state_dict patch runs and the guard is idle"
    if trl_guard.MONKEY_PATCH in state.guarded:
        return (
            "TRL has none, and verl-avspo's guard skips verl's state_dict patch for it (a value-head critic needs a "
            "checkpoint that AutoModelForTokenClassification loads)"
        )
    cause = _plugin_policy_problem() or "the verl.plugins entry point did not run in this process"
    raise RuntimeError(
        f"verl cannot build any model next to TRL {state.trl_without_value_head}, which has no {trl_guard.VALUE_HEAD}, "
        f"and verl-avspo's guard is not installed here: {cause}"
    )


def _trl() -> str:
    """TRL, when it is installed: its version against the TRL adapter's tested range, the adapter
    and ``GRPOTrainer`` importable, and verl next to it (:func:`_verl_next_to_trl`)."""
    if importlib.util.find_spec("trl") is None:
        return "not installed (pip install 'verl-avspo[trl]' for TRL's GRPOTrainer with ACR and AVSPO, docs/trl.md)"
    import trl
    from packaging.specifiers import SpecifierSet
    from trl import GRPOTrainer

    from verl_avspo.trl import TESTED_TRL, AVSPOGRPOTrainer

    if not issubclass(AVSPOGRPOTrainer, GRPOTrainer):
        raise RuntimeError(f"verl_avspo.trl.AVSPOGRPOTrainer does not subclass trl {trl.__version__}'s GRPOTrainer")
    tested = trl.__version__ in SpecifierSet(TESTED_TRL, prereleases=True)
    in_range = "tested" if tested else f"NOT in the tested range trl{TESTED_TRL}: pip install 'verl-avspo[trl]'"
    return (
        f"trl {trl.__version__} ({in_range}); GRPOTrainer and verl_avspo.trl.AVSPOGRPOTrainer import; "
        f"verl and TRL's value-head class: {_verl_next_to_trl()}"
    )


def run(args: argparse.Namespace) -> int:
    checks: list[tuple[str, Callable[[], str]]] = [
        ("versions", _versions),
        ("entry point", _entry_point),
        ("fresh `import verl`", _fresh_process),
    ]
    if not args.no_ray:
        checks.append(("Ray actor", _ray_actor))
    checks.append(("launcher config", _config))
    checks.append(("baselines", _baselines))
    checks.append(("stock main_ppo trainer", lambda: _stock_route(getattr(args, "overrides", ()))))
    checks.append(("TRL", _trl))
    failures = 0
    for name, check in checks:
        try:
            print(f"[ok]   {name}: {check()}")
        except Exception as err:
            failures += 1
            detail = "".join(traceback.format_exception_only(type(err), err)).strip()
            print(f"[FAIL] {name}: {detail}")
    print("all checks passed" if not failures else f"{failures} check(s) failed")
    return 1 if failures else 0
