"""OpenRLHF 0.11.2's own Ray PPO trainer, end to end on CPU: prompt dataset, generation, reward,
advantages, the DeepSpeed actor update, weight sync back to the generator, checkpoint and resume, with
the adapter's ACR metrics, AVSPO and the stall alert in OpenRLHF's TensorBoard log.

Every run is a real ``python -m openrlhf.cli.train_ppo_ray`` or ``python -m verl_avspo.openrlhf`` of
a tiny random Qwen2 (the harness in ``openrlhf_cpu``: vLLM is stood in for by Hugging Face
``generate``, and the GPU-only calls get CPU answers; nothing of OpenRLHF's is edited or mocked). A
run costs ~30 s, mostly process start-ups, so the five runs are launched once per module, two at a
time, and each test reads the logs and checkpoints of the run it is about:

- ``stock``: OpenRLHF's unmodified entry point, ``group_norm``, 2 steps;
- ``filtered``: our launcher, OpenRLHF's ``group_norm`` (ACR metrics only) with dynamic filtering
  and an alert (ACR above 0 on 2 steps in a row, ``stop``) that ends the run;
- ``avspo``: our launcher, ``avspo``, 4 steps, a checkpoint every step, an alert that warns;
- ``resumed``: ``avspo`` again, resumed (``--ckpt.load_enable``) from ``avspo``'s step-2 checkpoint
  by OpenRLHF's asynchronous trainer (``--train.async_enable``);
- ``filtered_skip``: our launcher, ``group_norm`` with dynamic filtering and prompts skipped before
  rollout, 8 prompts over 3 episodes.

Rollouts are random (OpenRLHF seeds neither its prompt shuffle nor the order rollouts return in), so
a test asserts what holds for any rollout: the metrics' closed forms and the controller's recursion.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import shutil

import pytest
import torch
from closed_forms import ACR_KEYS, AVSPO_KEYS, PROMPT_KEYS, next_threshold
from openrlhf_cpu.launch import AVSPO_ENTRY, GROUP_SIZE, OPENRLHF_ENTRY, TinyRun

pytestmark = [pytest.mark.slow, pytest.mark.openrlhf, pytest.mark.ray]

# The AVSPO settings of the avspo runs: a large eta and a threshold off the ACR grid (multiples of
# 1/4 with 4 groups a step), so the adaptive threshold moves on any step whose mean reward changes,
# and low, so AVSPO triggers on the first step with a collapsed group.
AVSPO = ["--algo.advantage.estimator", "avspo", "--avspo.eta", "0.5", "--avspo.threshold_init", "0.2"]
# An alert that fires on the second step in a row with any collapsed group.
ALERT = ["--acr.alert.rule", "acr", "--acr.alert.threshold", "0", "--acr.alert.window", "2"]
# OpenRLHF's group_norm (ACR metrics only) with dynamic filtering, and ALERT stopping the run;
# --ckpt.save_steps 100: the stop's checkpoint is the only one.
FILTERED = ["--algo.advantage.estimator", "group_norm", "--algo.dynamic_filtering_enable", "--ckpt.save_steps", "100"]
FILTERED += [*ALERT, "--acr.alert.action", "stop"]
# Dynamic filtering with skipping: 8 prompts over 3 episodes, so that prompts come back; a prompt collapsed on
# its one earlier visit is rolled out with probability 0.05.
FILTERED_SKIP = ["--algo.advantage.estimator", "group_norm", "--algo.dynamic_filtering_enable", "--ckpt.save_steps",
                 "100", "--train.num_episodes", "3", "--prompts.skip.enable", "true", "--prompts.skip.explore", "0.05",
                 "--prompts.skip.adaptive", "false"]  # fmt: skip
CLIENT_STATES = "mp_rank_00_model_states.pt"  # DeepSpeed's file that holds OpenRLHF's client states
STATE_KEY = "verl_avspo"  # the client state that holds the run tracker's state


@dataclasses.dataclass
class Outcome:
    run: TinyRun
    returncode: int

    def scalars(self) -> dict[str, dict[int, float]]:
        """OpenRLHF's TensorBoard scalars ``{key: {step: value}}`` (``train/`` dropped), checked to
        come from a run that ended well."""
        if self.returncode != 0:
            pytest.fail(f"the run in {self.run.workdir} exited with {self.returncode}:\n{self.run.log()[-6000:]}")
        logged = self.run.scalars()
        return {tag.removeprefix("train/"): dict(values) for tag, values in logged.items() if tag.startswith("train/")}

    def client_states(self, step: int) -> dict:
        path = self.run.workdir / "ckpt" / "_actor" / f"global_step{step}" / CLIENT_STATES
        return torch.load(path, weights_only=False)


def _resume_from(source: TinyRun, step: int, target: TinyRun) -> None:
    """Give ``target`` the checkpoint of ``source``'s step ``step`` as its latest."""
    folder = target.workdir / "ckpt" / "_actor"
    shutil.copytree(source.workdir / "ckpt" / "_actor" / f"global_step{step}", folder / f"global_step{step}")
    (folder / "latest").write_text(f"global_step{step}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Outcome]:
    # Built here, one after the other: transformers' lazy imports are not thread-safe.
    # The filtered run gets every prompt of the task: it ends when the alert stops it, well before.
    sizes = {"avspo": 16, "resumed": 16, "stock": 8, "filtered": 72, "filtered_skip": 8}
    prepared = {name: TinyRun.prepare(tmp_path_factory.mktemp(name), num_prompts=size) for name, size in sizes.items()}

    def launch(name: str, entry: str, arguments: list[str]) -> Outcome:
        return Outcome(prepared[name], prepared[name].launch(entry, arguments).returncode)

    def avspo_then_resumed() -> dict[str, Outcome]:
        avspo = launch("avspo", AVSPO_ENTRY, [*AVSPO, *ALERT, "--ckpt.max_num", "10"])
        _resume_from(avspo.run, 2, prepared["resumed"])
        resumed = launch("resumed", AVSPO_ENTRY, [*AVSPO, *ALERT, "--ckpt.load_enable", "--train.async_enable"])
        return {"avspo": avspo, "resumed": resumed}

    def the_others() -> dict[str, Outcome]:
        return {
            "stock": launch("stock", OPENRLHF_ENTRY, ["--algo.advantage.estimator", "group_norm"]),
            "filtered": launch("filtered", AVSPO_ENTRY, FILTERED),
            "filtered_skip": launch("filtered_skip", AVSPO_ENTRY, FILTERED_SKIP),
        }

    # Two at a time: a run is mostly single-threaded process start-ups, and the machine has two cores.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        lanes = [pool.submit(avspo_then_resumed), pool.submit(the_others)]
        return {name: outcome for lane in lanes for name, outcome in lane.result().items()}


def _check_every_step(scalars: dict[str, dict[int, float]], keys: tuple[str, ...], steps: list[int]) -> None:
    for key in keys:
        assert sorted(scalars.get(key, {})) == steps, f"{key} is not logged at steps {steps}"
    for step in steps:
        assert math.isfinite(scalars["policy_loss"][step])  # OpenRLHF's own: the actor update ran
        assert 0.0 <= scalars["acr/effective"][step] <= 1.0
        rate, correct, wrong = (scalars[f"acr/{kind}"][step] for kind in ("rate", "all_correct", "all_wrong"))
        assert rate == pytest.approx(correct + wrong) and 0.0 <= rate <= 1.0


def _next_threshold(theta: float, signal: float, mean_reward: float, previous_mean_reward: float) -> float:
    """θ's update with the runs' eta 0.5 and the default bounds [0.1, 0.9]."""
    return next_threshold(theta, signal, mean_reward, previous_mean_reward, eta=0.5, bounds=(0.1, 0.9))


def test_unmodified_openrlhf_trains_and_syncs_its_weights_to_the_generator(runs):
    outcome = runs["stock"]
    scalars = outcome.scalars()
    assert sorted(scalars["policy_loss"]) == [1, 2]
    assert not any(key.startswith(("acr/", "avspo/")) for key in scalars)  # the adapter is not there
    assert (outcome.run.workdir / "ckpt" / "_actor" / "global_step2" / CLIENT_STATES).exists()
    from safetensors.torch import load_file

    trained = load_file(outcome.run.workdir / "final" / "model.safetensors")
    initial = load_file(outcome.run.model / "model.safetensors")
    generator = torch.load(outcome.run.workdir / "generator_weights.pt", weights_only=True)
    assert set(trained) <= set(generator)
    for name, weight in trained.items():  # the generator holds exactly what the trainer saved
        assert torch.equal(generator[name].to(weight.dtype), weight), name
    assert any(not torch.equal(trained[name], initial[name].to(trained[name].dtype)) for name in initial)


def test_avspo_run_logs_acr_and_avspo_every_step_and_the_threshold_follows_its_update(runs):
    scalars = runs["avspo"].scalars()
    _check_every_step(scalars, ACR_KEYS + AVSPO_KEYS + PROMPT_KEYS, [1, 2, 3, 4])
    assert all(groups == 4 for groups in scalars["acr/groups"].values())  # 4 prompts x 4 responses a step
    # The per-prompt history, keyed by each prompt's text: one pass over the file's 16 prompts, 4 new a step.
    assert [scalars["prompts/seen"][step] for step in (1, 2, 3, 4)] == [4, 8, 12, 16]
    thresholds = scalars["avspo/threshold"]
    assert thresholds[1] == pytest.approx(0.2)
    for step in (2, 3, 4):  # θ_t from step t-1's signal and mean rewards, as the controller computes it
        previous = scalars["acr/reward_mean"].get(step - 2, scalars["acr/reward_mean"][step - 1])
        expected = _next_threshold(
            thresholds[step - 1], scalars["avspo/signal"][step - 1], scalars["acr/reward_mean"][step - 1], previous
        )
        assert thresholds[step] == pytest.approx(expected, abs=1e-6), step
    # AVSPO augmented collapsed groups on some step, so their advantages are no longer all zero.
    assert any(
        scalars["avspo/triggered"][step] > 0 and scalars["acr/effective"][step] < scalars["acr/rate"][step]
        for step in thresholds
    )


def test_alert_warns_and_its_state_is_checkpointed(runs):
    outcome = runs["avspo"]
    scalars = outcome.scalars()
    streak = 0
    for step in (1, 2, 3, 4):  # acr/stalled: ACR above 0 on this step and the one before
        streak = streak + 1 if scalars["acr/rate"][step] > 0 else 0
        assert scalars["acr/stalled"][step] == float(streak >= 2), step
        assert outcome.client_states(step)[STATE_KEY]["stagnation"]["streak"] == streak
    # The warning comes once, on the first stalled step (with 4 groups a step, half of them two-digit
    # sums a random policy rarely writes, nearly always step 2).
    first = next((step for step in (1, 2, 3, 4) if scalars["acr/stalled"][step] == 1.0), None)
    warning = "advantage collapse: ACR above 0.00 for 2 consecutive steps (now step {}, --acr.alert.rule=acr)"
    if first is None:
        assert "advantage collapse" not in outcome.run.log()
    else:
        assert outcome.run.log().count(warning.format(first)) == 1


def test_resumed_async_run_continues_the_threshold_and_the_alert(runs):
    uninterrupted = runs["avspo"].scalars()
    resumed = runs["resumed"].scalars()
    _check_every_step(resumed, ACR_KEYS + AVSPO_KEYS, [3, 4])
    saved = runs["avspo"].client_states(2)[STATE_KEY]
    # Step 3's threshold comes from the checkpoint alone: exactly the uninterrupted run's.
    assert resumed["avspo/threshold"][3] == pytest.approx(uninterrupted["avspo/threshold"][3], abs=1e-9)
    # Step 4's follows from step 3's own rollouts and the restored mean reward of step 2 (a fresh
    # controller would see no change in mean reward and keep the threshold).
    assert saved["controller"]["previous_mean_score"] == pytest.approx(uninterrupted["acr/reward_mean"][2])
    expected = _next_threshold(
        resumed["avspo/threshold"][3],
        resumed["avspo/signal"][3],
        resumed["acr/reward_mean"][3],
        saved["controller"]["previous_mean_score"],
    )
    assert resumed["avspo/threshold"][4] == pytest.approx(expected, abs=1e-6)
    # Step 3's rollouts differ between the runs (OpenRLHF's are unseeded), so step 4's thresholds agree
    # within what one update from the same θ_3 can move them apart.
    theta = resumed["avspo/threshold"][3]
    spread = 0.5 * (abs(resumed["avspo/signal"][3] - theta) + abs(uninterrupted["avspo/signal"][3] - theta))
    assert resumed["avspo/threshold"][4] == pytest.approx(uninterrupted["avspo/threshold"][4], abs=spread + 1e-6)
    final = runs["resumed"].client_states(4)
    assert final["global_step"] == 4 and final[STATE_KEY]["controller"]["step"] == 4  # 2 restored + 2
    streak = saved["stagnation"]["streak"] + 1 if resumed["acr/rate"][3] > 0 else 0
    assert runs["resumed"].client_states(3)[STATE_KEY]["stagnation"]["streak"] == streak
    assert resumed["acr/stalled"][3] == float(streak >= 2)


def test_acr_is_measured_before_dynamic_filtering_and_the_alert_stops_the_run(runs):
    outcome = runs["filtered"]
    scalars = outcome.scalars()
    rates = scalars["acr/rate"]
    stalled = [step for step in sorted(rates) if step > 1 and rates[step - 1] > 0 and rates[step] > 0]
    assert stalled, f"no 2 steps in a row of {len(rates)} had a collapsed group: the alert was not tried"
    last = stalled[0]  # the alert stops the run on the second step in a row with a collapsed group
    _check_every_step(scalars, ACR_KEYS, list(range(1, last + 1)))
    assert not any(key.startswith("avspo/") for key in scalars)
    for step in range(1, last + 1):
        trained_groups = scalars["rollout/num_samples"][step] / GROUP_SIZE
        generated_groups = scalars["acr/groups"][step]
        # Filtering drops exactly the collapsed groups (binary rewards all 0 or all 1), so ACR before
        # it is the dropped share, and none of the trained groups is collapsed.
        assert generated_groups >= trained_groups
        assert rates[step] == pytest.approx((generated_groups - trained_groups) / generated_groups)
        assert scalars["acr/effective"][step] == 0.0
        assert scalars["acr/stalled"][step] == float(step == last)
    assert "dynamic_filtering_pass_rate" in scalars
    log = outcome.run.log()
    assert f"stopping the run after step {last} (--acr.alert.action stop)" in log
    assert "Prompt dataloader is exhausted" not in log  # prompts were left: the stop ended the run
    checkpoints = sorted(p.name for p in (outcome.run.workdir / "ckpt" / "_actor").glob("global_step*"))
    assert checkpoints == [f"global_step{last}"]
    assert outcome.client_states(last)[STATE_KEY]["stagnation"] == {"streak": 2, "stalled": True, "rewards": []}
    assert outcome.client_states(last)[STATE_KEY]["controller"] is None  # OpenRLHF's estimator: no AVSPO state
    assert (outcome.run.workdir / "final" / "model.safetensors").exists()  # OpenRLHF's end-of-run save ran


def test_dynamic_filtering_with_skipping_never_generates_a_skipped_prompt_and_counts_every_rollout(runs):
    """Each step logs the rollouts it generated (every group measured: the trained and those filtering
    dropped), its prompt draws and their sum; the prompts skipped were never generated, each replaced by a
    further draw (OpenRLHF trains on as many groups as it first sent out) unless the episode's data ran out,
    which leaves its place open: a saving (seen here in episodes 2-3 when most prompts collapsed in the first;
    not asserted, as OpenRLHF seeds neither its shuffle nor its rollouts). The saving over filtering alone
    on the same prompts: tests/openrlhf/test_trainer.py."""
    scalars = runs["filtered_skip"].scalars()
    steps = sorted(scalars["acr/rate"])
    # (OpenRLHF trains no step whose batch filtering left short of --train.batch_size: no policy_loss there.)
    for key in ("train/rollouts_generated", "train/gen_batches", "train/rollouts_cumulative", "prompts/skipped"):
        assert sorted(scalars.get(key, {})) == steps, f"{key} is not logged at steps {steps}"
    generated = [scalars["train/rollouts_generated"][step] for step in steps]
    for step in steps:
        groups = scalars["acr/groups"][step]
        # Every generated group is measured, those of a call filtering emptied (no step trained on it) included.
        assert scalars["train/rollouts_generated"][step] == GROUP_SIZE * groups, step
        # Each generation batch (the step's, one per group filtering replaced, and those of calls it emptied)
        # generated at least one group.
        assert 1 <= scalars["train/gen_batches"][step] <= groups, step
        skipped, reselected = scalars["prompts/skipped"][step], scalars["prompts/reselected"][step]
        assert reselected + scalars["prompts/rollouts_skipped"][step] / GROUP_SIZE == skipped, step
    assert [scalars["train/rollouts_cumulative"][step] for step in steps] == pytest.approx(
        list(itertools.accumulate(generated))
    )
    assert sum(scalars["prompts/skipped"].values()) > 0, "nothing was skipped: the counts above hold vacuously"
