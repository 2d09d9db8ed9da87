"""Every OpenRLHF name the adapter relies on that OpenRLHF does not document as an extension point, where it is
used and why no public door serves (OpenRLHF 0.11.2; docs/integration.md §7). OpenRLHF has no estimator
registry, no trainer hooks and no option to choose its classes: each method the adapter's subclasses override
is an internal one, and the launcher sets three module names to them (``extension``). :func:`check_openrlhf`
(``compat``) checks the entries :func:`verl_avspo.openrlhf.install` relies on (``EXTENDED``) before it sets
them; ``tests/openrlhf/test_openrlhf_surface.py`` checks every entry against the installed OpenRLHF, and
that the adapter's source touches no other private OpenRLHF name.

Importing this module imports no OpenRLHF: the probes import it when they run.
"""

from __future__ import annotations

import inspect
import runpy
import sys
import typing
from types import SimpleNamespace
from unittest import mock

from verl_avspo.core.surface import Touch, resolve

__all__ = ["PASS_THROUGH", "OPENRLHF_EPSILON", "OPENRLHF_GROUP_ESTIMATORS", "EXTENDED", "SURFACE", "namespaces"]

EM = "openrlhf.trainer.ppo_utils.experience_maker"
SG = "openrlhf.trainer.ppo_utils.samples_generator"
PT = "openrlhf.trainer.ppo_trainer"
PTA = "openrlhf.trainer.ppo_trainer_async"
ADVANTAGE_METHOD = f"{EM}:RemoteExperienceMaker.compute_advantages_and_returns"
# The estimator name AVSPO runs OpenRLHF's group_norm under: its group if/elif and batch whitening match
# no such name, so the rewards AVSPO wrote reach the per-token stage unchanged.
PASS_THROUGH = "avspo"
# OpenRLHF's group_norm divides by (std + 1e-9); the same epsilon makes untouched groups identical.
OPENRLHF_EPSILON = 1e-9
# The estimators for which OpenRLHF's train_ppo_ray asserts n_samples_per_prompt > 1.
OPENRLHF_GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")


def _advantages(estimator: str, rewards: list[float], group_size: int = 2):
    """OpenRLHF's own advantage method run on one response per reward (one-token copies,
    ``advantage_step.one_token_copies``), ``group_size`` to a prompt, its args' estimator ``estimator`` and
    the maker's own ``group_norm``: each response's advantage on its action token."""
    import torch

    from verl_avspo.openrlhf.advantage_step import one_token_copies

    ns = SimpleNamespace
    args = ns(
        rollout=ns(n_samples_per_prompt=group_size),
        algo=ns(advantage=ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
        reward=ns(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    values = torch.tensor(rewards, dtype=torch.float32)
    experiences = one_token_copies(list(values.split(1)), [[i] for i in range(len(rewards))])
    maker_class = resolve(f"{EM}:RemoteExperienceMaker")
    maker = maker_class(None, None, None, None, ns(value=0.0), ns(args=args), None)
    maker.advantage_estimator = "group_norm"
    inspect.unwrap(resolve(ADVANTAGE_METHOD))(maker, experiences)
    return torch.cat([experience.advantages[:, 0] for experience in experiences])


def _probe_pass_through() -> str | None:
    """The group step leaves an estimator named :data:`PASS_THROUGH` alone, and the per-token stage (which
    reads the maker's own name) still turns each reward into the response's advantage."""
    import torch

    rewards = [1.0, 0.0, 1.0, 1.0]  # the second prompt collapsed: group_norm would zero it
    try:
        advantages = _advantages(PASS_THROUGH, rewards)
    except Exception as error:  # any failure means the structure is not the one the adapter relies on
        return f"{ADVANTAGE_METHOD} run with estimator {PASS_THROUGH!r} failed ({type(error).__name__}: {error})"
    if not torch.equal(advantages, torch.tensor(rewards)):
        return f"{ADVANTAGE_METHOD} no longer leaving the rewards of an estimator named {PASS_THROUGH!r} unchanged"
    return None


def _probe_group_norm_epsilon() -> str | None:
    """OpenRLHF's group_norm is (r - mean) / (std + :data:`OPENRLHF_EPSILON`), which AVSPO reproduces on the
    groups it leaves untouched."""
    import torch

    rewards = torch.tensor([0.0, 2e-9, 1.0, 0.0])  # a std of the epsilon's size tells it apart
    expected = []
    for group in rewards.view(-1, 2):
        expected += ((group - group.mean()) / (group.std() + OPENRLHF_EPSILON)).tolist()
    try:
        advantages = _advantages("group_norm", rewards.tolist())
    except Exception as error:
        return f"{ADVANTAGE_METHOD} run with group_norm failed ({type(error).__name__}: {error})"
    if not torch.allclose(advantages, torch.tensor(expected), rtol=1e-5, atol=1e-6):
        return f"group_norm gives {advantages.tolist()}, not (r - mean) / (std + {OPENRLHF_EPSILON}) = {expected}"
    return None


def _probe_called_by_advantage_method(name: str):
    def probe() -> str | None:
        code = getattr(inspect.unwrap(resolve(ADVANTAGE_METHOD)), "__code__", None)
        if code is None or name not in code.co_names:
            return f"a call of {name} in RemoteExperienceMaker.compute_advantages_and_returns is missing"
        return None

    return probe


def _probe_generate_samples_result() -> str | None:
    """``generate_samples`` returns (samples, filter pass rate, prompts consumed, exhausted)."""
    annotation = inspect.signature(resolve(f"{SG}:SamplesGenerator.generate_samples")).return_annotation
    parts = typing.get_args(annotation)
    if len(parts) != 4 or parts[-1] is not bool:
        return f"SamplesGenerator.generate_samples returns {annotation}, not (samples, pass rate, consumed, exhausted)"
    return None


def _probe_prompt_batch() -> str | None:
    """``_collect_prompt_batch(iterator, n)`` reads (_, prompts, labels, images) batches and returns (prompts,
    labels, images, exhausted), exhausted once the iterator is drained."""
    draw = resolve(f"{SG}:_collect_prompt_batch")
    batches = iter([(None, ["p0", "p1"], ["l0", "l1"], [None, None])])
    first, second = draw(batches, 1), draw(batches, 2)
    if first != (["p0"], ["l0"], [None], False) or second != ([], [], [], True):
        return f"_collect_prompt_batch returned {first!r} then {second!r}, not (prompts, labels, images, exhausted)"
    return None


def _probe_experience_fields() -> str | None:
    import dataclasses

    fields = {field.name for field in dataclasses.fields(resolve("openrlhf.trainer.ppo_utils.experience:Experience"))}
    missing = sorted({"rewards", "index", "prompts", "info", "advantages", "action_mask"} - fields)
    return f"Experience has no field {', '.join(missing)}" if missing else None


def _probe_group_size_rule() -> str | None:
    """train_ppo_ray refuses a group size of 1 for exactly :data:`OPENRLHF_GROUP_ESTIMATORS` (the launcher refuses
    them first, with the fix). Runs its command line up to ``ray.init``, which is stopped."""
    import ray

    class Started(Exception):
        pass

    refused = []
    for estimator in ("gae", "reinforce", *OPENRLHF_GROUP_ESTIMATORS):
        argv = ["train_ppo_ray", "--algo.advantage.estimator", estimator, "--rollout.n_samples_per_prompt", "1"]
        with mock.patch.object(sys, "argv", argv), mock.patch.object(ray, "init", side_effect=Started):
            try:
                runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
            except AssertionError as error:
                if "n_samples_per_prompt" in str(error):
                    refused.append(estimator)
            except (Started, Exception, SystemExit):  # past the check (or stopped before it: reported below)
                pass
    if tuple(refused) != OPENRLHF_GROUP_ESTIMATORS:
        return f"train_ppo_ray refuses n_samples_per_prompt 1 for {refused}, not for {list(OPENRLHF_GROUP_ESTIMATORS)}"
    return None


def _probe_checkpoint_folder() -> str | None:
    code = inspect.unwrap(resolve(f"{PT}:BasePPOTrainer.init_checkpoint_states")).__code__
    return None if "_actor" in code.co_consts else f"{PT}.BasePPOTrainer.init_checkpoint_states no longer reads _actor"


NO_HOOK = "OpenRLHF has no estimator registry and no trainer hooks"
NO_CLASS_OPTION = "OpenRLHF has no option to choose its trainer classes"


def _probe_looked_up_by_name(function: str, names: tuple[str, ...]):
    """``function`` reads each of ``names`` when it runs (a global or an ``import ... from``), so a class
    set under that name before it runs is the one it uses."""

    def probe() -> str | None:
        code = getattr(inspect.unwrap(resolve(function)), "__code__", None)
        missing = [name for name in names if code is None or name not in code.co_names]
        return f"{function} no longer looks up {', '.join(missing)} by name when it runs" if missing else None

    return probe


def _probe_remote_class_ships_the_launchers_names() -> str | None:
    """Ray ships ``PPOTrainerAsync`` (a ``@ray.remote`` class) to its actor by value, its ``__init__`` with the
    module names it uses as this process has them: the actor classes the launcher set there."""
    from ray import cloudpickle

    module = resolve(PTA)
    sent = cloudpickle.loads(cloudpickle.dumps(module.PPOTrainerAsync.__ray_actor_class__)).__init__.__globals__
    for name in ("TrainingActor", "GenerateSamplesActor"):
        if getattr(sent.get(name), "__ray_actor_class__", 0) is not getattr(module, name).__ray_actor_class__:
            return f"Ray no longer ships PPOTrainerAsync with this process's {name}"
    return None


EXTENDED = (
    Touch(
        ADVANTAGE_METHOD,
        "openrlhf/trainer_wrap.py",
        f"{NO_HOOK}: the group baselines are an if/elif inside this method, so the subclass runs the step's "
        "measurement and AVSPO's group step before it, with the args' estimator set to the pass-through name, and "
        "runs it on one-token copies for each response's group-step output (acr/effective)",
        call=(2, ()),
        probe=_probe_pass_through,
    ),
    Touch(
        f"{EM}:apply_length_penalties",
        "openrlhf/trainer_wrap.py",
        "AVSPO's group step must see the length-penalised rewards, which OpenRLHF penalises inside the advantage "
        "method right before its group step: the subclass calls this first, then the method with the penalties' "
        "args (reward.overlong_buffer_len, reward.stop_properly_penalty_coef) off",
        call=(2, ()),
        probe=_probe_called_by_advantage_method("apply_length_penalties"),
    ),
    Touch(
        f"{EM}:RemoteExperienceMaker.make_experience_batch",
        "openrlhf/trainer_wrap.py",
        f"{NO_HOOK}: the one call that sees the rollout list, which carries the groups dynamic filtering dropped",
        call=(2, ()),
    ),
    Touch(
        f"{SG}:SamplesGenerator.generate_samples",
        "openrlhf/generation.py",
        f"{NO_HOOK}: the generation step, where dropped groups are found, rollouts counted and a stopped run "
        "reports the prompts exhausted",
        call=(1, ("n_samples_per_prompt",)),
    ),
    Touch(
        f"{SG}:SamplesGenerator._process_response_into_experience",
        "openrlhf/generation.py",
        "the one place a generated response and its reward (the response's 'reward' entry) are seen together, "
        "dropped by dynamic filtering or not",
        call=(2, ()),
    ),
    Touch(
        f"{SG}:SamplesGenerator._dispatch_prompts_to_vllm",
        "openrlhf/generation.py",
        "the one call that receives each prompt batch drawn for rollout (the step's, and each dynamic filtering's "
        "replacement), where the skip rule must act before the rollout; no sampler hook",
        call=(3, ("images",)),
    ),
    Touch(
        f"{PT}:BasePPOTrainer._compute_rollout_stats",
        "openrlhf/trainer_wrap.py",
        "the step's metrics OpenRLHF logs (wandb, TensorBoard, console) are built here; no metrics hook",
        call=(2, ()),
    ),
    Touch(
        f"{PT}:BasePPOTrainer.save_logs_and_checkpoints",
        "openrlhf/trainer_wrap.py",
        "the one call with a step's logged metrics and the checkpoint's client states: the stall rule, the "
        "tracker's state and the alert's stop",
        call=(4, ()),
    ),
    Touch(
        f"{PT}:BasePPOTrainer.init_checkpoint_states",
        "openrlhf/trainer_wrap.py",
        "where a resumed run's client states (the tracker's) are read back; no resume hook",
        call=(1, ()),
    ),
    Touch(
        f"{PT}:PPOTrainer",
        "openrlhf/extension.py",
        f"{NO_CLASS_OPTION}: train_ppo_ray's train() imports this name when it runs; the launcher sets it to the "
        "tracked synchronous trainer (attribute set 1 of 3)",
        probe=_probe_looked_up_by_name("openrlhf.cli.train_ppo_ray:train", ("PPOTrainer", "PPOTrainerAsync")),
    ),
    Touch(
        f"{PTA}:TrainingActor",
        "openrlhf/extension.py",
        f"{NO_CLASS_OPTION}: PPOTrainerAsync creates its training actor by this name; the launcher sets it to the "
        "tracked one (attribute set 2 of 3)",
        probe=_probe_looked_up_by_name(f"{PTA}:PPOTrainerAsync.__ray_actor_class__.__init__", ("TrainingActor",)),
    ),
    Touch(
        f"{PTA}:GenerateSamplesActor",
        "openrlhf/extension.py",
        f"{NO_CLASS_OPTION}: PPOTrainerAsync creates its generation actor by this name; the launcher sets it to "
        "the one whose generator is tracked (attribute set 3 of 3)",
        probe=_probe_looked_up_by_name(
            f"{PTA}:PPOTrainerAsync.__ray_actor_class__.__init__", ("GenerateSamplesActor",)
        ),
    ),
    Touch(
        f"{PTA}:PPOTrainerAsync",
        "openrlhf/extension.py",
        "the asynchronous trainer runs in its own Ray actor: the actor classes the launcher set must reach it, "
        "which Ray's shipping of a remote class by value does (no hook in the workers)",
        probe=_probe_remote_class_ships_the_launchers_names,
    ),
)
SURFACE = (
    *EXTENDED,
    Touch(
        f"{SG}:SamplesGenerator.generate_samples",
        "openrlhf/generation.py",
        "the format of its result, which the wrapper reads and, for a stopped run, returns: (samples, filter "
        "pass rate, prompts consumed, exhausted)",
        probe=_probe_generate_samples_result,
    ),
    Touch(
        f"{SG}:_collect_prompt_batch",
        "openrlhf/generation.py, openrlhf/launcher.py",
        "OpenRLHF 0.11's prompt draw, called by the skip rule to refill the places of the prompts it skipped, as "
        "OpenRLHF draws (absent before 0.11: the launcher then refuses --prompts.skip.enable)",
        call=(2, ()),
        probe=_probe_prompt_batch,
    ),
    Touch(
        f"{SG}:SamplesGenerator._sample_buffer",
        "openrlhf/generation.py",
        "the generated samples served by a later step: not dropped, although not returned now",
        set_by="generate_samples",
    ),
    Touch(
        f"{SG}:SamplesGenerator._dataloader_iter",
        "openrlhf/generation.py",
        "the training prompts' iterator the step's batch was drawn from, which the skip rule's refills draw from",
        set_by="generate_samples",
    ),
    Touch(
        f"{SG}:SamplesGenerator.args",
        "openrlhf/generation.py",
        "the group size when generate_samples is called without n_samples_per_prompt",
        set_by="__init__",
    ),
    Touch(
        f"{EM}:RemoteExperienceMaker.advantage_estimator",
        "openrlhf/trainer_wrap.py",
        "the estimator the per-token stage reads, which stays the user's while the args' name passes AVSPO's "
        "advantages through",
        set_by="__init__",
    ),
    Touch(
        f"{EM}:RemoteExperienceMaker.strategy",
        "openrlhf/trainer_wrap.py",
        "the run's args (group size, the estimator switched to the pass-through name for the call)",
        set_by="__init__",
    ),
    Touch(
        f"{PT}:BasePPOTrainer.experience_maker",
        "openrlhf/trainer_wrap.py",
        "the trainer's experience maker, which holds the run tracker",
        set_by="__init__",
    ),
    Touch(
        f"{PT}:PPOTrainer.__ray_actor_class__.samples_generator",
        "openrlhf/trainer_wrap.py",
        "the synchronous trainer's generator, given the tracker (skip rule) and stopped by the alert",
        set_by="__init__",
    ),
    Touch(
        f"{PT}:BasePPOTrainer.args",
        "openrlhf/trainer_wrap.py",
        "ckpt.save_steps is set to 1 for the stalled step's checkpoint, then restored; ckpt.path names it",
        set_by="__init__",
    ),
    Touch(
        "openrlhf.trainer.ppo_utils.experience:Experience",
        "openrlhf/advantage_step.py, openrlhf/generation.py",
        "the fields read and written: rewards, index (prompt order), prompts, info['reward'] and "
        "info['group_reward_std'], advantages, action_mask",
        probe=_probe_experience_fields,
    ),
    Touch(
        f"{PT}:BasePPOTrainer.init_checkpoint_states",
        "openrlhf/trainer_wrap.py, tools/prompts.py",
        "the checkpoint layout: <ckpt.path>/_actor/global_step<N>/ holds DeepSpeed's mp_rank_00_model_states.pt "
        "with the client states (a copied rule: tools/prompts.py reads the tracker's state there)",
        probe=_probe_checkpoint_folder,
    ),
    Touch(
        ADVANTAGE_METHOD,
        "openrlhf/launcher.py (OPENRLHF_EPSILON)",
        "a copied constant: group_norm's 1e-9, AVSPO's epsilon under OpenRLHF so untouched groups match",
        probe=_probe_group_norm_epsilon,
    ),
    Touch(
        "openrlhf.cli.train_ppo_ray",
        "openrlhf/launcher.py (OPENRLHF_GROUP_ESTIMATORS)",
        "a copied rule: the estimators train_ppo_ray asserts a group size above 1 for, refused by the launcher "
        "first with the fix (OpenRLHF's is a bare AssertionError after its imports)",
        probe=_probe_group_size_rule,
    ),
    Touch(
        "ray:init",
        "openrlhf/launcher.py",
        "train_ppo_ray calls ray.init itself and offers no runtime_env option: the launcher's process replaces it "
        "by a call that adds the settings to the workers' environment variables",
        call=(0, ("runtime_env",)),
    ),
)


def namespaces() -> list:
    """The OpenRLHF modules and classes the adapter touches: where its private names live."""
    em, sg, pt, pta = (resolve(name) for name in (EM, SG, PT, PTA))
    return [
        em,
        sg,
        pt,
        pta,
        em.RemoteExperienceMaker,
        sg.SamplesGenerator,
        pt.BasePPOTrainer,
        pt.PPOTrainer.__ray_actor_class__,
        pta.PPOTrainerAsync.__ray_actor_class__,
        pta.TrainingActor.__ray_actor_class__,
        pta.GenerateSamplesActor.__ray_actor_class__,
    ]
