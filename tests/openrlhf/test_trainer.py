"""The OpenRLHF adapter's subclasses over the real OpenRLHF trainer code (openrlhf 0.11.2, installed with
--no-deps by `make setup`).

What runs for real: OpenRLHF's RemoteExperienceMaker (split, group step, per-token returns),
SamplesGenerator with dynamic filtering, BasePPOTrainer's rollout stats, TensorBoard logging and
checkpoint client states (the run tracker's state; a checkpoint without one resumes afresh, another
version's is refused), the stall alert's stop (checkpoint, then no more samples), the launcher's choice of
OpenRLHF's trainer classes, and the tracked experience maker in a real Ray worker, its settings from the
runtime_env. Each step's raw rewards are measured once (counted).

What is stood in for, and why:
- `vllm` and `flash_attn`: import-only stubs (conftest.py).
- vLLM engines and DeepSpeed model actors need GPUs: generation is served by an object whose
  `.remote()` calls return `ray.put` results, the model forward of make_experience is skipped
  (experiences carry zero KL), and the actor group that saves checkpoints records its client states.
The whole training run, OpenRLHF's and our launcher's, is tests/e2e/test_openrlhf_cpu_e2e.py.
"""

import copy
import importlib.util
import json
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from verl_avspo.core.advantage import compute_avspo_outcome_advantage
from verl_avspo.core.config import resolve_settings
from verl_avspo.core.controller import AdaptiveController
from verl_avspo.core.prompt_history import prompt_key

pytestmark = pytest.mark.openrlhf

if importlib.util.find_spec("openrlhf") is None:
    pytest.skip("openrlhf is not installed (make setup installs it with --no-deps)", allow_module_level=True)

GROUP_SIZE = 4
# Six prompts x 4 answers: two mixed, one all-correct, two all-wrong, one non-binary mixed.
REWARDS = torch.tensor([[1.0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0], [0.5, 0.25, 1, 0], [0, 0, 0, 0]])
COLLAPSED = torch.tensor([False, True, True, False, False, True])


def make_args(estimator="group_norm", tmp_path=None, **overrides):
    """The parts of train_ppo_ray's hierarchical args that the code under test reads."""
    ns = SimpleNamespace
    args = ns(
        rollout=ns(n_samples_per_prompt=GROUP_SIZE, micro_batch_size=3, batch_size=6, vllm_generate_batch_size=6),
        train=ns(dynamic_batch_enable=False, seed=0),
        algo=ns(
            advantage=ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False, is_correction_level="off"),
            kl=ns(use_loss=True, target=None, init_coef=0.0, horizon=10000, estimator="k3"),
            dynamic_filtering_enable=False,
            dynamic_filtering_range=(0.0, 1.0),
        ),
        reward=ns(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
        vllm=ns(enable_sleep=False),
        ds=ns(ring_attn_size=1, tensor_parallel_size=1),
        actor=ns(num_nodes=1, num_gpus_per_node=1),
        logger=ns(
            wandb=ns(key=None, run_name="run"),
            tensorboard_dir=str(tmp_path / "tb") if tmp_path else None,
            logging_steps=1,
        ),
        ckpt=ns(best_metric_key="", save_steps=1, path=str(tmp_path / "ckpt") if tmp_path else "", load_enable=True),
        eval=ns(steps=float("inf")),
    )
    for key, value in overrides.items():
        setattr(args.algo, key, value)
    return args


class Tokenizer:
    """Only what the experience maker reads off a tokenizer (no model is loaded)."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return ["<decoded>"]


def samples(openrlhf, rewards):
    """One single-response Experience per answer, grouped by prompt as generation returns them."""
    out = []
    for prompt, row in enumerate(rewards.tolist()):
        for answer, reward in enumerate(row):
            length = 2 + (prompt + answer) % 3
            action_mask = torch.zeros(1, 5, dtype=torch.bool)
            action_mask[0, :length] = True
            out.append(
                openrlhf.Experience(
                    sequences=torch.ones(1, 6, dtype=torch.long),
                    attention_mask=torch.ones(1, 6, dtype=torch.long),
                    action_mask=action_mask,
                    kl=torch.zeros(1, 5),
                    rewards=torch.tensor([reward]),
                    response_length=torch.tensor([length]),
                    truncated=torch.tensor([False]),
                    total_length=torch.tensor([6.0]),
                    prompts=[f"p{prompt}"],
                    labels=[str(prompt)],
                    info={"reward": torch.tensor([reward])},
                )
            )
    return out


def shuffled_micro_batches(openrlhf, rollout):
    """Micro-batches in an order unrelated to the prompts, as OpenRLHF's seqlen balancing makes
    them: each response keeps its rollout position in ``index``."""
    for i, sample in enumerate(rollout):
        sample.index = [i]
    permutation = torch.randperm(len(rollout), generator=torch.Generator().manual_seed(0)).tolist()
    return [
        openrlhf.Experience.concat_experiences([rollout[j] for j in permutation[k : k + 5]], 0)
        for k in range(0, len(rollout), 5)
    ]


def maker(openrlhf, args, cls=None):
    """The adapter's experience maker (``cls``: another, OpenRLHF's own)."""
    return (cls or openrlhf.Maker)(
        None, None, None, None, openrlhf.FixedKLController(0.0), SimpleNamespace(args=args), Tokenizer()
    )


def per_response(experiences):
    """{rollout position: (advantage on each action token, advantage on non-action tokens)}."""
    out = {}
    for experience in experiences:
        for row, position in enumerate(experience.index):
            mask = experience.action_mask[row]
            out[position] = (experience.advantages[row][mask], experience.advantages[row][~mask])
    return out


def run_original(openrlhf, args, experiences):
    """OpenRLHF's own compute_advantages_and_returns, on OpenRLHF's own maker."""
    return maker(openrlhf, args, openrlhf.em.RemoteExperienceMaker).compute_advantages_and_returns(experiences)


def run_both(openrlhf, args):
    """REWARDS' experiences through our maker, and a copy through OpenRLHF's own method.
    Returns (ours, theirs, our maker)."""
    experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS))
    reference = run_original(openrlhf, args, copy.deepcopy(experiences))
    ours = maker(openrlhf, args)
    ours.compute_advantages_and_returns(experiences)
    return experiences, reference, ours


def test_plain_group_norm_is_untouched_and_logs_acr(openrlhf, monkeypatch):
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    args = make_args("group_norm")
    experiences, reference, ours = run_both(openrlhf, args)
    for mine, theirs in zip(experiences, reference, strict=True):
        assert torch.equal(mine.advantages, theirs.advantages)
    metrics = ours.verl_avspo_metrics
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.5
    assert metrics["acr/all_correct"] == pytest.approx(1 / 6) and metrics["acr/all_wrong"] == pytest.approx(2 / 6)
    assert metrics["acr/groups"] == 6 and not any(key.startswith("avspo/") for key in metrics)
    assert args.algo.advantage.estimator == "group_norm"


@pytest.mark.parametrize("estimator", ["group_norm", "dr_grpo"])
def test_avspo_equals_core_and_openrlhf_on_untouched_groups(openrlhf, monkeypatch, estimator):
    settings = {"preset": "paper_code", "epsilon": 1e-9}
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", '{"preset": "paper_code", "epsilon": 1e-9}')
    args = make_args(estimator)
    ours = maker(openrlhf, args)
    experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS))
    reference = per_response(run_original(openrlhf, args, copy.deepcopy(experiences)))
    ours.compute_advantages_and_returns(experiences)
    mine = per_response(experiences)

    config, acr = resolve_settings(settings)
    core = compute_avspo_outcome_advantage(
        REWARDS.reshape(-1, 1),
        torch.ones(REWARDS.numel(), 1),
        torch.arange(6).repeat_interleave(GROUP_SIZE),
        config,
        acr,
        AdaptiveController(config, acr),
        norm_adv_by_std=estimator == "group_norm",
    ).scalar_advantages
    # One opposite-label virtual sample: ±1/sqrt(n+1) with the std, ±1/(n+1) without (docs/method.md §4).
    push = 1 / math.sqrt(GROUP_SIZE + 1) if estimator == "group_norm" else 1 / (GROUP_SIZE + 1)
    for position, (tokens, outside) in mine.items():
        prompt = position // GROUP_SIZE
        assert torch.all(outside == 0)
        torch.testing.assert_close(tokens, torch.full_like(tokens, core[position].item()))
        if COLLAPSED[prompt]:
            sign = 1.0 if REWARDS[prompt, 0] == 1 else -1.0
            torch.testing.assert_close(tokens, torch.full_like(tokens, sign * push))
            assert torch.all(reference[position][0] == 0)
        else:
            torch.testing.assert_close(tokens, reference[position][0])
    metrics = ours.verl_avspo_metrics
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0
    assert metrics["avspo/triggered"] == 0.5 and metrics["avspo/virtual_k"] == 1.0
    assert args.algo.advantage.estimator == estimator


def test_avspo_keeps_openrlhfs_group_reward_std_of_the_rewards(openrlhf, monkeypatch):
    # OpenRLHF computes group_reward_std from experience.rewards after the length penalties, where
    # AVSPO's step has already written its advantages; the logged std must stay the rewards'.
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_ACR", raising=False)
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", '{"preset": "paper_code", "epsilon": 1e-9}')
    experiences, reference, _ = run_both(openrlhf, make_args("group_norm"))
    for mine, theirs in zip(experiences, reference, strict=True):
        torch.testing.assert_close(mine.info["group_reward_std"], theirs.info["group_reward_std"])
    assert any(float(e.info["group_reward_std"].max()) > 0 for e in experiences)


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo"])
def test_without_avspo_acr_effective_reads_openrlhfs_own_group_step(openrlhf, monkeypatch, estimator):
    """acr/effective comes from OpenRLHF's group-step output (each response's scalar advantage, before the reward
    clip and without the KL): with a KL penalty in the reward and a clip, the three collapsed groups still give
    all-zero outputs and the others none, and the advantages stay OpenRLHF's own."""
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_ACR", raising=False)
    args = make_args(estimator)
    args.reward.clip_range = (-0.1, 0.1)
    experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS))
    for experience in experiences:
        experience.kl = torch.full_like(experience.kl, 0.25)
    ours = openrlhf.Maker(
        None, None, None, None, openrlhf.FixedKLController(0.5), SimpleNamespace(args=args), Tokenizer()
    )
    theirs = openrlhf.em.RemoteExperienceMaker(
        None, None, None, None, openrlhf.FixedKLController(0.5), SimpleNamespace(args=args), Tokenizer()
    )
    reference = theirs.compute_advantages_and_returns(copy.deepcopy(experiences))
    ours.compute_advantages_and_returns(experiences)
    for mine, expected in zip(experiences, reference, strict=True):
        assert torch.equal(mine.advantages, expected.advantages)
    assert ours.verl_avspo_metrics["acr/rate"] == 0.5 and ours.verl_avspo_metrics["acr/effective"] == 0.5


def test_reinforce_baseline_logs_no_effective_acr(openrlhf, monkeypatch):
    # Its batch whitening shifts every advantage, collapsed groups' too: acr/effective would mislead.
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_ACR", raising=False)
    ours = maker(openrlhf, make_args("reinforce_baseline"))
    ours.compute_advantages_and_returns(shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS)))
    assert ours.verl_avspo_metrics["acr/rate"] == 0.5 and "acr/effective" not in ours.verl_avspo_metrics


def test_acr_only_runs_take_the_metrics_reward_range(openrlhf, monkeypatch):
    # reward_range [-1, 1] puts the all-correct/all-wrong midpoint at 0, so all-zero groups count
    # as all-correct; OpenRLHF's own rloo still computes the advantages.
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_ACR", '{"reward_range": [-1, 1]}')
    experiences, reference, ours = run_both(openrlhf, make_args("rloo"))
    for mine, theirs in zip(experiences, reference, strict=True):
        assert torch.equal(mine.advantages, theirs.advantages)
    metrics = ours.verl_avspo_metrics
    assert metrics["acr/rate"] == 0.5 and metrics["acr/all_correct"] == 0.5 and metrics["acr/all_wrong"] == 0.0


def test_avspo_sees_the_length_penalised_rewards(openrlhf, monkeypatch):
    """OpenRLHF applies the overlong penalty before its group step; AVSPO's step runs after it too."""
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", '{"preset": "grpo", "epsilon": 1e-9}')
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_ACR", '{"reward_range": [-1, 1]}')
    args = make_args("group_norm")
    args.reward.overlong_buffer_len, args.reward.overlong_penalty_factor, args.rollout.max_new_tokens = 2, 1.0, 5
    experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS))
    reference = per_response(run_original(openrlhf, args, copy.deepcopy(experiences)))
    maker(openrlhf, args).compute_advantages_and_returns(experiences)
    mine = per_response(experiences)
    # The penalty splits some collapsed groups, so the two agree everywhere, penalised groups included.
    assert any(reference[p][0].abs().sum() > 0 for p in range(4, 8))
    for position, (tokens, _) in mine.items():
        torch.testing.assert_close(tokens, reference[position][0], atol=1e-5, rtol=1e-5)


def test_installed_structure_missing_is_a_clear_error(openrlhf, monkeypatch):
    from verl_avspo.openrlhf import OpenRLHFIncompatibleError, check_openrlhf

    monkeypatch.delattr(openrlhf.sg.SamplesGenerator, "generate_samples")
    lacks = r"OpenRLHF 0\.11\.2 lacks .*SamplesGenerator\.generate_samples"
    with pytest.raises(OpenRLHFIncompatibleError, match=lacks):
        check_openrlhf()
    monkeypatch.undo()
    monkeypatch.setattr(openrlhf.em, "compute_reward", None)
    with pytest.raises(OpenRLHFIncompatibleError, match=r"supported: openrlhf>=0\.10\.4,<0\.12"):
        check_openrlhf()


def test_an_openrlhf_whose_group_step_touches_other_names_is_refused(openrlhf, monkeypatch):
    """The compatibility probe runs OpenRLHF's own advantage method on a tiny batch: a version whose
    group step normalised every estimator name would also normalise AVSPO's output, and is refused."""
    from verl_avspo.openrlhf import OpenRLHFIncompatibleError, check_openrlhf

    wrapped = openrlhf.em.RemoteExperienceMaker.compute_advantages_and_returns
    em = openrlhf.em

    def normalising_every_name(self, experiences):
        for experience in experiences:
            experience.rewards = experience.rewards - experience.rewards.mean()
        em.apply_length_penalties, em.compute_reward  # noqa: B018 (the names the method must reach)
        return wrapped(self, experiences)

    monkeypatch.setattr(em.RemoteExperienceMaker, "compute_advantages_and_returns", normalising_every_name)
    with pytest.raises(OpenRLHFIncompatibleError, match=r"leaving the rewards of an estimator named 'avspo'"):
        check_openrlhf()

    def without_the_per_token_stage(self, experiences):
        em.apply_length_penalties  # noqa: B018
        return experiences

    monkeypatch.setattr(em.RemoteExperienceMaker, "compute_advantages_and_returns", without_the_per_token_stage)
    with pytest.raises(OpenRLHFIncompatibleError, match=r"run with estimator 'avspo' failed \(AttributeError"):
        check_openrlhf()

    def penalising_itself(self, experiences):  # a method that no longer calls apply_length_penalties by name
        return wrapped(self, experiences)

    monkeypatch.setattr(em.RemoteExperienceMaker, "compute_advantages_and_returns", penalising_itself)
    with pytest.raises(OpenRLHFIncompatibleError, match=r"a call of apply_length_penalties in RemoteExperienceMaker"):
        check_openrlhf()


def test_launcher_feeds_the_real_openrlhf_cli_and_ray_init(openrlhf, monkeypatch, tmp_path):
    """OpenRLHF's own parser and checks accept what the launcher passes; the ray.init OpenRLHF calls gets the
    settings on top of its own environment variables and no setup hook; OpenRLHF's three actor class names
    are the tracked trainers'."""
    import ray

    from verl_avspo.openrlhf import launcher

    calls = []

    class Stop(Exception):
        pass

    def fake_init(*args, **kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", "")
    monkeypatch.syspath_prepend(openrlhf.stub_dir)
    argv = ["--actor.model_name_or_path", str(tmp_path), "--reward.remote_url", "http://localhost:1"]
    argv += ["--rollout.n_samples_per_prompt", "4", "--algo.advantage.estimator", "avspo"]
    argv += ["--avspo.preset", "paper_code"]
    with pytest.raises(Stop):
        launcher.main(argv)
    runtime_env = calls[0]["runtime_env"]
    assert "worker_process_setup_hook" not in runtime_env and "NCCL_DEBUG" in runtime_env["env_vars"]
    # train_ppo_ray builds the tracked trainers: the launcher set OpenRLHF's three actor class names.
    from openrlhf.trainer import ppo_trainer_async

    from verl_avspo.openrlhf import extension

    assert issubclass(openrlhf.pt.PPOTrainer.__ray_actor_class__, extension.TrackedTrainer)
    assert issubclass(ppo_trainer_async.TrainingActor.__ray_actor_class__, extension.TrackedTrainer)
    generation_actor = ppo_trainer_async.GenerateSamplesActor.__ray_actor_class__
    assert generation_actor.__qualname__.endswith("TrackedGenerateSamplesActor")
    # paper_code keeps the released code's epsilon (1e-4); other presets get OpenRLHF's 1e-9.
    assert runtime_env["env_vars"]["VERL_AVSPO_OPENRLHF_SETTINGS"] == '{"preset": "paper_code"}'
    monkeypatch.delitem(sys.modules, "openrlhf.cli.train_ppo_ray", raising=False)


@pytest.fixture(scope="module")
def ray_session(openrlhf):
    import ray
    from ray import cloudpickle

    from verl_avspo.openrlhf.launcher import runtime_env_hook

    settings = {"preset": "paper_code", "epsilon": 1e-9}
    python_path = os.pathsep.join([openrlhf.stub_dir, *sys.path])
    init = runtime_env_hook(ray.init, settings)
    runtime_env = {"env_vars": {"PYTHONPATH": python_path}}
    init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def worker_probe(rewards):
    """Runs in a fresh Ray worker: OpenRLHF's experience maker, tracked as the trainers' is, makes advantages."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from verl_avspo.openrlhf.extension import TrackedExperienceMaker

    modules = SimpleNamespace(Experience=Experience, FixedKLController=FixedKLController, Maker=TrackedExperienceMaker)
    experiences = shuffled_micro_batches(modules, samples(modules, rewards))
    remote_maker = maker(modules, make_args("group_norm"))
    remote_maker.compute_advantages_and_returns(experiences)
    return per_response(experiences), remote_maker.verl_avspo_metrics


def test_the_tracked_maker_runs_avspo_in_a_ray_worker_with_the_launchers_settings(ray_session):
    advantages, metrics = ray_session.get(ray_session.remote(worker_probe).remote(REWARDS))
    assert metrics["avspo/triggered"] == 0.5 and metrics["acr/rate"] == 0.5
    for position, (tokens, _) in advantages.items():
        if COLLAPSED[position // GROUP_SIZE]:
            assert tokens.abs().min().item() == pytest.approx(1 / math.sqrt(GROUP_SIZE + 1), abs=1e-6)


class FakeEngines:
    """Stands in for vLLM engine actors (GPU only): answers each prompt with GROUP_SIZE responses
    whose rewards are that prompt's row of REWARDS."""

    def __init__(self, ray):
        ray_put = ray.put
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: ray_put(0))
        self.generate_responses = SimpleNamespace(remote=lambda **kwargs: ray_put(self.responses(**kwargs)))

    @staticmethod
    def responses(prompt, label, num_samples, **_):
        row = REWARDS[int(label)].tolist()
        return [
            {
                "observation_tokens": [1, 2, 3, 4],
                "action_ranges": [(2, 4)],
                "reward": reward,
                "scores": reward,
                "rollout_log_probs": None,
                "prompt": prompt,
                "label": label,
                "truncated": False,
            }
            for reward in row[:num_samples]
        ]


def test_acr_is_measured_before_dynamic_filtering(openrlhf, ray_session, monkeypatch):
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    args = make_args("group_norm", dynamic_filtering_enable=True)
    args.rollout.batch_size = args.rollout.vllm_generate_batch_size = 3
    prompts = [(["source"], [f"p{i}"], [str(i)], [None]) for i in range(6)]
    generator = openrlhf.Generator(SimpleNamespace(args=args), prompts, None, Tokenizer(), [FakeEngines(ray_session)])
    rollout, _, consumed, _ = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
    # Prompts 0-2 go out; 1 and 2 collapse, are filtered and replaced by 3 and 4: 0, 3, 4 are trained.
    assert consumed == 5 and len(rollout) == 3 * GROUP_SIZE
    assert sorted(map(tuple, rollout.dropped_rewards.tolist())) == sorted(map(tuple, REWARDS[1:3].tolist()))
    assert sorted(rollout.dropped_prompts) == ["p1", "p2"]

    experience_maker = maker(openrlhf, args)
    monkeypatch.setattr(experience_maker, "make_experience", lambda batches: batches)  # the model forward (GPU)
    for sample in rollout:
        sample.kl = torch.zeros_like(sample.action_mask, dtype=torch.float32)
    experience_maker.make_experience_batch(rollout)
    metrics = experience_maker.verl_avspo_metrics
    assert metrics["acr/rate"] == 0.4 and metrics["acr/groups"] == 5  # every generated group
    assert metrics["acr/all_correct"] == 0.2 and metrics["acr/all_wrong"] == 0.2
    assert metrics["acr/effective"] == 0.0  # the trained groups all have a signal
    # The dropped groups enter the per-prompt history with the trained ones when the step closes.
    tracker = experience_maker._verl_avspo_step.tracker
    tracker.observe_step(1, metrics)
    assert metrics["prompts/seen"] == 5
    seen = tracker.prompt_history.lookup([prompt_key(f"p{i}") for i in range(5)])
    assert seen.visits.tolist() == [1] * 5
    assert (seen.all_correct + seen.all_wrong).tolist() == COLLAPSED[:5].int().tolist()


def test_groups_of_a_call_that_trains_nothing_are_measured_with_the_next_step(openrlhf, ray_session, monkeypatch):
    """An episode whose last prompts filtering all drops ends in a call that returns no samples (OpenRLHF
    trains no step on it); those groups' rewards and prompts come with the next call's own dropped groups,
    so the step that counts their rollouts also measures them."""
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    args = make_args("group_norm", dynamic_filtering_enable=True)
    args.rollout.batch_size = args.rollout.vllm_generate_batch_size = 2
    generator = openrlhf.Generator(
        SimpleNamespace(args=args),
        [(["source"], [f"p{i}"], [str(i)], [None]) for i in (1, 2)],
        None,
        Tokenizer(),
        [FakeEngines(ray_session)],
    )
    rollout, _, consumed, exhausted = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
    assert (len(rollout), consumed, exhausted) == (0, 2, True)  # both collapsed, nothing left to draw
    generator.prompts_dataloader = [(["source"], [f"p{i}"], [str(i)], [None]) for i in (0, 5, 3)]  # next episode
    rollout, _, consumed, _ = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
    assert sorted({sample.prompts[0] for sample in rollout}) == ["p0", "p3"] and consumed == 3
    # (Groups come back in whatever order the engines finish: compared as sets of rows.)
    assert sorted(map(tuple, rollout.dropped_rewards.tolist())) == sorted(map(tuple, REWARDS[[1, 2, 5]].tolist()))
    assert sorted(rollout.dropped_prompts) == ["p1", "p2", "p5"]
    rollout, _, _, _ = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
    assert rollout.dropped_rewards is None  # carried once, not again


class RecordingActorGroup:
    """Stands in for the DeepSpeed actor group (GPU only): keeps the client states it is asked to save."""

    def __init__(self, ray, saved=None):
        self.ray, self.saved = ray, saved

    def async_run_method(self, method_name, **kwargs):
        if method_name == "save_checkpoint":
            self.saved = copy.deepcopy(kwargs["client_states"])
            return [self.ray.put(None)]
        assert method_name == "get_checkpoint_states"
        return [self.ray.put(self.saved)]


def test_metrics_reach_tensorboard_and_avspo_state_survives_resume(openrlhf, ray_session, monkeypatch, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = '{"preset": "paper", "eta": 0.5, "threshold_init": 0.3, "epsilon": 1e-9}'
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", settings)
    args = make_args("group_norm", tmp_path)

    def trainer(group):
        return openrlhf.Trainer(SimpleNamespace(args=args), group, None, None, None, None, Tokenizer())

    def step(run, rewards):
        experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, rewards))
        run.experience_maker.compute_advantages_and_returns(experiences)
        return per_response(experiences), run._compute_rollout_stats(experiences)

    first = trainer(RecordingActorGroup(ray_session))
    assert first.init_checkpoint_states()["global_step"] == 0
    _, stats = step(first, REWARDS)
    first.save_logs_and_checkpoints(1, stats, {"global_step": 1})
    first.tensorboard_logger.close()
    step(first, 1 - REWARDS)
    continued, continued_stats = step(first, REWARDS)

    events = EventAccumulator(os.path.join(args.logger.tensorboard_dir, "run"))
    events.Reload()
    logged = {tag: events.Scalars(tag)[0].value for tag in events.Tags()["scalars"]}
    for key in ("acr/rate", "acr/all_correct", "acr/all_wrong", "acr/effective", "avspo/threshold"):
        assert logged[f"train/{key}"] == pytest.approx(stats[key])

    os.makedirs(os.path.join(args.ckpt.path, "_actor"))
    resumed = trainer(RecordingActorGroup(ray_session, first.actor_model_group.saved))
    assert resumed.init_checkpoint_states()["global_step"] == 1
    step(resumed, 1 - REWARDS)
    after_resume, resumed_stats = step(resumed, REWARDS)
    # theta_3 = 0.3 + eta * sign(J_2 - J_1) * (ACR_2 - 0.3) = 0.4; a run without the state would be at 0.3.
    assert resumed_stats["avspo/threshold"] == continued_stats["avspo/threshold"] == pytest.approx(0.4)
    for position, (tokens, _) in continued.items():
        assert torch.equal(tokens, after_resume[position][0])


def test_alert_stop_checkpoints_the_stalled_step_and_ends_generation(openrlhf, ray_session, monkeypatch, tmp_path):
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    alert = '{"alert": {"rule": "acr", "threshold": 0.3, "window": 2, "action": "stop"}}'
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_ACR", alert)
    args = make_args("group_norm", tmp_path)
    args.ckpt.save_steps = 100  # the stop saves its step whatever this says
    group = RecordingActorGroup(ray_session)
    trainer = openrlhf.Trainer(SimpleNamespace(args=args), group, None, None, None, None, Tokenizer())
    prompts = [(["source"], [f"p{i}"], [str(i)], [None]) for i in range(6)]
    trainer.samples_generator = openrlhf.Generator(
        SimpleNamespace(args=args), prompts, None, Tokenizer(), [FakeEngines(ray_session)]
    )

    def step(number):
        experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, REWARDS))  # ACR 0.5 > 0.3
        trainer.experience_maker.compute_advantages_and_returns(experiences)
        stats = trainer._compute_rollout_stats(experiences)
        trainer.save_logs_and_checkpoints(number, stats, {"global_step": number})
        return stats

    assert step(1)["acr/stalled"] == 0.0 and group.saved is None  # not stalled yet; no checkpoint due
    assert step(2)["acr/stalled"] == 1.0
    assert group.saved["global_step"] == 2 and args.ckpt.save_steps == 100
    assert group.saved["verl_avspo"]["stagnation"] == {"streak": 2, "stalled": True, "rewards": []}
    assert group.saved["verl_avspo"]["controller"] is None  # no AVSPO in this run
    rollout, _, consumed, exhausted = trainer.samples_generator.generate_samples(n_samples_per_prompt=GROUP_SIZE)
    assert list(rollout) == [] and consumed == 0 and exhausted  # OpenRLHF's fit loop ends here

    resumed = openrlhf.Trainer(
        SimpleNamespace(args=args), RecordingActorGroup(ray_session, group.saved), None, None, None, None, Tokenizer()
    )
    os.makedirs(os.path.join(args.ckpt.path, "_actor"), exist_ok=True)
    resumed.init_checkpoint_states()
    assert resumed.experience_maker._verl_avspo_step.tracker.alert.streak == 2


def test_a_checkpoint_without_our_client_state_resumes_afresh_and_another_versions_is_refused(
    openrlhf, ray_session, monkeypatch, tmp_path, caplog
):
    """A checkpoint of a run without verl-avspo resumes with the tracker started afresh, and a warning; a run
    state of another version (an unreleased build's layout) is refused, naming the version."""
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", json.dumps({"preset": "paper", "epsilon": 1e-9}))
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_ACR", raising=False)
    args = make_args("group_norm", tmp_path)
    os.makedirs(os.path.join(args.ckpt.path, "_actor"))

    def resume(saved):
        trainer = openrlhf.Trainer(
            SimpleNamespace(args=args), RecordingActorGroup(ray_session, saved), None, None, None, None, Tokenizer()
        )
        return trainer, trainer.init_checkpoint_states()

    with caplog.at_level("WARNING"):
        trainer, states = resume({"global_step": 2})
    assert states["global_step"] == 2 and trainer.experience_maker._verl_avspo_step.tracker.controller.step == 0
    assert "holds no 'verl_avspo' client state" in caplog.text
    with pytest.raises(ValueError, match=r"the run state has version 3, .* reads version 4 only"):
        resume({"global_step": 2, "verl_avspo": {"version": 3, "controller": None, "stagnation": None}})


@pytest.mark.parametrize(("estimator", "settings"), [("group_norm", '{"preset": "paper_code"}'), ("rloo", "")])
def test_raw_rewards_are_measured_once_per_step(openrlhf, monkeypatch, estimator, settings):
    """One measurement per training step, AVSPO's group step and acr/effective included."""
    from verl_avspo.core import advantage, collapse, run_tracker

    calls = []
    measure = collapse.measure

    def counted(*args, **kwargs):
        calls.append(args[0].numel())
        return measure(*args, **kwargs)

    for module in (collapse, run_tracker, advantage):
        monkeypatch.setattr(module, "measure", counted)
    monkeypatch.setenv("VERL_AVSPO_OPENRLHF_SETTINGS", settings)
    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_ACR", raising=False)
    args = make_args(estimator)
    args.ckpt.save_steps = 100  # no checkpoint: no actor group is needed
    trainer = openrlhf.Trainer(SimpleNamespace(args=args), None, None, None, None, None, Tokenizer())
    for step, rewards in enumerate((REWARDS, 1 - REWARDS, REWARDS), start=1):
        experiences = shuffled_micro_batches(openrlhf, samples(openrlhf, rewards))
        trainer.experience_maker.compute_advantages_and_returns(experiences)
        stats = trainer._compute_rollout_stats(experiences)
        trainer.save_logs_and_checkpoints(step, stats, {"global_step": step})
        assert calls == [REWARDS.numel()] * step
        assert {"acr/rate", "acr/effective", "acr/stalled"} <= set(stats)
        assert ("avspo/threshold" in stats) == (estimator == "group_norm")


def skipping_generator(openrlhf, ray_session, monkeypatch, skip: bool, **overrides):
    """OpenRLHF's sync sample generator over prompts p0..p5 (3 a batch) and its experience maker, started
    as PPOTrainer.fit starts them, with skipping on or off; p1 and p2 collapsed on 12 earlier visits (kept
    with probability 0.05**12 when skipping). Returns (generator, experience_maker)."""
    from verl_avspo.openrlhf.advantage_step import PROMPT_SKIP_ENV

    monkeypatch.delenv("VERL_AVSPO_OPENRLHF_SETTINGS", raising=False)
    monkeypatch.setenv(PROMPT_SKIP_ENV, json.dumps({"enable": skip, "explore": 0.05, "adaptive": False}))
    args = make_args("group_norm", **overrides)
    args.rollout.batch_size = args.rollout.vllm_generate_batch_size = 3
    args.ckpt.load_enable = False
    prompts = [(["source"], [f"p{i}"], [str(i)], [None]) for i in range(6)]
    generator = openrlhf.Generator(SimpleNamespace(args=args), prompts, None, Tokenizer(), [FakeEngines(ray_session)])
    trainer = openrlhf.Trainer(SimpleNamespace(args=args), None, None, None, None, None, Tokenizer())
    trainer.samples_generator = generator
    trainer.init_checkpoint_states()
    experience_maker = trainer.experience_maker
    tracker = experience_maker._verl_avspo_step.tracker
    for visit in range(12):
        tracker.prompt_history.record(
            [prompt_key("p1"), prompt_key("p2")], [1.0, 0.0], [True, False], [False, True], visit
        )
    return generator, experience_maker


def test_prompts_are_keyed_for_the_history_and_skipped_before_rollout(openrlhf, ray_session, monkeypatch):
    """The sync trainer's start links its generator to the maker's tracker; prompts whose groups
    collapsed on every earlier visit are not sent to rollout, others are drawn in their place; the
    trained groups are recorded under the hash of their prompt text."""
    generator, experience_maker = skipping_generator(openrlhf, ray_session, monkeypatch, skip=True)
    tracker = experience_maker._verl_avspo_step.tracker
    assert generator._verl_avspo_tracker is tracker and tracker.skipper is not None

    rollout, _, consumed, _ = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
    assert sorted({sample.prompts[0] for sample in rollout}) == ["p0", "p3", "p4"] and consumed == 3
    monkeypatch.setattr(experience_maker, "make_experience", lambda batches: batches)  # the model forward (GPU)
    for sample in rollout:
        sample.kl = torch.zeros_like(sample.action_mask, dtype=torch.float32)
    experience_maker.make_experience_batch(rollout)
    metrics = {**experience_maker.verl_avspo_metrics}
    tracker.observe_step(1, metrics)
    # p3 and p4 were drawn in their place: re-selections, no rollout saved.
    assert metrics["prompts/skipped"] == metrics["prompts/reselected"] == 2 and metrics["prompts/rollouts_skipped"] == 0
    assert (metrics["train/rollouts_generated"], metrics["train/gen_batches"]) == (3 * GROUP_SIZE, 1)
    assert metrics["prompts/seen"] == 5  # p1, p2 and the three trained now
    records = tracker.prompt_history.lookup([prompt_key(p) for p in ("p0", "p3", "p4")])
    assert records.visits.tolist() == [1, 1, 1] and records.last_pass_rate.tolist() == [0.75, 0.25, 0.4375]


def test_with_dynamic_filtering_skipping_generates_fewer_rollouts_than_filtering_alone(
    openrlhf, ray_session, monkeypatch
):
    """The same prompts, the same history (p1 and p2 collapsed on 12 visits), dynamic filtering on: alone,
    it generates p1 and p2, drops them and draws p3 and p4 for them; with skipping, p1 and p2 are never
    generated and p3 and p4 go out at once. Each step logs the rollouts it generated and its generation
    batches (the batch, then one per prompt filtering replaced); the skipped places were refilled, so the
    saving shows in the rollouts generated, not as rollouts skipped."""

    def step(skip: bool) -> dict:
        generator, experience_maker = skipping_generator(
            openrlhf, ray_session, monkeypatch, skip=skip, dynamic_filtering_enable=True
        )
        tracker = experience_maker._verl_avspo_step.tracker
        rollout, _, _, _ = generator.generate_samples(n_samples_per_prompt=GROUP_SIZE, max_len=8)
        assert sorted({sample.prompts[0] for sample in rollout}) == ["p0", "p3", "p4"]
        metrics: dict = {}
        tracker.observe_step(1, metrics)
        return metrics

    alone, skipping = step(False), step(True)
    assert (alone["train/rollouts_generated"], alone["train/gen_batches"]) == (5 * GROUP_SIZE, 3)
    assert (skipping["train/rollouts_generated"], skipping["train/gen_batches"]) == (3 * GROUP_SIZE, 1)
    assert skipping["train/rollouts_cumulative"] == 3 * GROUP_SIZE
    assert skipping["prompts/reselected"] == 2 and skipping["prompts/rollouts_skipped"] == 0
