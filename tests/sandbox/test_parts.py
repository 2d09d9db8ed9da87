"""The sandbox's pieces: task split and verifier, tokenizer, its sampler (the distribution it draws
from, greedy decoding, its own generator), token rewards, estimator specs, validation messages,
DAPO's dynamic sampling (its rollout accounting and cap, on scripted batches), the skip rule's
candidate draws (``+skip``), the epochs mode's fixed training set (``--train-set``: its draw, its
permutations, refills from the current epoch, its validation), padding rollouts together, the summary
verdict, its training-prompt shares and the plots. No model training here."""

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from verl_avspo.cli import main
from verl_avspo.sandbox.cli import _check_allocation
from verl_avspo.sandbox.config import SandboxConfig
from verl_avspo.sandbox.estimators import parse_estimators
from verl_avspo.sandbox.policy import Rollout
from verl_avspo.sandbox.sampling import TrainingEpochs, draw_kept, dynamic_sampling
from verl_avspo.sandbox.summary import verdicts
from verl_avspo.sandbox.task import ArithmeticTask, Problems, exact_match, level_shares, parse_levels
from verl_avspo.tools.plots import plot_metrics
from verl_avspo.tools.seed_stats import paired_t

pytestmark = pytest.mark.verl


def test_levels_and_held_out_split():
    task = ArithmeticTask(parse_levels("1+1,2*1"), 50)
    small, large = task.eval_set(0), task.eval_set(1)
    assert len(small.prompts) == 20  # at most a fifth of the 100 problems of 1+1
    assert len(large.prompts) == 50
    assert all(eval(p[:-1]) == int(a) for p, a in zip(large.prompts, large.answers, strict=True))
    train = task.sample(20_000, torch.Generator().manual_seed(0))  # every problem of each pool, in all likelihood
    warm_up = task.sample_warm_up(20_000, torch.Generator().manual_seed(0))
    held_out = set(small.prompts + large.prompts)
    assert not set(train.prompts) & held_out  # never train on a held-out problem
    assert not set(warm_up.prompts) & held_out  # nor warm up on one
    assert not set(train.prompts) & set(warm_up.prompts)  # the RL prompts are new to the warmed-up policy
    assert set(train.level.tolist()) == set(warm_up.level.tolist()) == {0, 1}
    # 1+1: 100 problems, 20 held out, half of the other 80 for the warm-up; 2*1: 900, 50, then 425 and 425.
    assert [len({p for p, lv in zip(train.prompts, train.level.tolist(), strict=True) if lv == i}) for i in (0, 1)] == [
        40,
        425,
    ]
    assert len({p for p, lv in zip(warm_up.prompts, warm_up.level.tolist(), strict=True) if lv == 0}) == 40
    assert task.max_answer_chars == 3  # 99*9 = 891
    assert len(ArithmeticTask(parse_levels("1+1"), 8, warm_up_share=0.25).training_set(69, torch.Generator()).prompts)
    with pytest.raises(ValueError, match=r"train_set=70 is too large.*pools hold 69 problems \(1\+1 69\)"):
        ArithmeticTask(parse_levels("1+1"), 8, warm_up_share=0.25).training_set(70, torch.Generator())
    for share in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"warm_up_share={share} is invalid.*strictly between 0 and 1"):
            SandboxConfig(warm_up_share=share)


def test_bad_levels_are_named():
    with pytest.raises(ValueError, match=r"level '2-1' is invalid"):
        parse_levels("1+1,2-1")
    with pytest.raises(ValueError, match="names a level twice"):
        parse_levels("1+1,1+1")
    # Each level is enumerated: 6+6 (8.1e11 problems) must be refused, not fail to allocate.
    assert parse_levels("4*3")[0].num_problems == 9000 * 900
    with pytest.raises(ValueError, match=r"level '6\+6' has 810,000,000,000 problems.*use fewer digits"):
        parse_levels("1+1,6+6")


def test_exact_match_verifier():
    assert exact_match(["12", "12 ", "012", ""], ["12", "12", "12", "0"]).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_tokenizer_round_trip_and_masks():
    from verl_avspo.sandbox.policy import CharTokenizer

    tok = CharTokenizer()
    ids, mask = tok.encode_prompts(["1+2=", "10+20="])
    assert ids.shape == (2, 7) and mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    response_ids, response_mask = tok.encode_responses(["3", "30"])
    assert response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert tok.decode_responses(response_ids, response_mask) == ["3", "30"]
    # A special token inside a response can never match an answer.
    bad = torch.tensor([[tok.encode("3")[0], tok.bos_id, tok.eos_id]])
    assert tok.decode_responses(bad, torch.ones_like(bad)) == ["3?"]
    with pytest.raises(ValueError, match="not in the tokenizer's alphabet"):
        tok.encode("1-2=")


def test_token_rewards_sum_to_the_score_on_the_last_token():
    from verl_avspo.sandbox.loop import _token_rewards

    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    rewards = _token_rewards(torch.tensor([1.0, 0.0, 1.0]), mask)
    assert rewards.tolist() == [[0, 1, 0], [0, 0, 0], [1, 0, 0]]


def test_estimator_specs():
    grpo, avspo, code, dapo = parse_estimators("grpo,avspo,avspo:paper_code,dapo")
    assert (avspo.adv_estimator, avspo.preset, code.preset) == ("avspo", "paper", "paper_code")
    assert (dapo.adv_estimator, dapo.drop_collapsed, grpo.drop_collapsed) == ("grpo", True, False)
    assert code.algorithm_config(seed=3).avspo == {"preset": "paper_code", "seed": 3}
    assert "avspo" not in grpo.algorithm_config(seed=0)
    with pytest.raises(ValueError, match=r"estimator 'gae' is not supported by the sandbox"):
        parse_estimators("grpo,gae")
    with pytest.raises(ValueError, match="unknown AVSPO preset 'papr'"):
        parse_estimators("avspo:papr")
    with pytest.raises(ValueError, match="only avspo takes a preset"):
        parse_estimators("grpo:paper")
    with pytest.raises(ValueError, match="'grpo' and 'grpo' are one estimator"):
        parse_estimators("grpo,rloo,grpo")
    with pytest.raises(ValueError, match="'avspo' and 'avspo:paper' are one estimator"):
        parse_estimators("avspo,avspo:paper")  # paper is avspo's default preset


def test_alloc_specs_carry_the_budget_share_and_refuse_what_they_cannot_combine_with():
    grpo, half, code = parse_estimators("grpo+alloc,grpo+alloc=0.5,avspo:paper_code+alloc")
    assert (grpo.budget_share, half.budget_share, code.budget_share, code.preset) == (1.0, 0.5, 1.0, "paper_code")
    allocation = half.prompt_allocation(seed=7, group_size=16)
    assert (allocation.enable, allocation.budget_share, allocation.seed) == (True, 0.5, 7)
    # The largest group is 2G at any G: at G = 16 the allocator's default (16) would turn the extras off.
    assert [half.prompt_allocation(7, g).max_group_size for g in (4, 8, 16)] == [8, 16, 32]
    assert parse_estimators("grpo")[0].prompt_allocation(seed=7, group_size=16) is None
    for spec in ("grpo+skip+alloc", "dapo+alloc", "dapo_resample+alloc"):
        with pytest.raises(ValueError, match=r"\+alloc does not combine with dapo, dapo_resample or \+skip"):
            parse_estimators(spec)
    with pytest.raises(ValueError, match=r"'grpo\+alloc=0': prompt_allocation.budget_share=0.0 is invalid"):
        parse_estimators("grpo+alloc=0")
    with pytest.raises(ValueError, match=r"write the allocator as \+alloc or \+alloc=<budget share>"):
        parse_estimators("grpo+alloc+skip")
    with pytest.raises(ValueError, match="'grpo\\+alloc' and 'grpo\\+alloc=1' are one estimator"):
        parse_estimators("grpo+alloc,grpo+alloc=1")


def test_cli_rejects_bad_values_before_loading_anything(capsys):
    with pytest.raises(SystemExit, match=r"estimator 'foo' is not supported"):
        main(["sandbox", "--estimators", "grpo,foo"])
    with pytest.raises(SystemExit, match=r"group_size=1 is invalid"):
        main(["sandbox", "--group-size", "1"])
    with pytest.raises(SystemExit, match=r"prompts_per_step=3 is invalid: .* use a multiple of 2"):
        main(["sandbox", "--prompts-per-step", "3"])
    with pytest.raises(SystemExit, match=r"--seeds=0 is invalid"):
        main(["sandbox", "--seeds", "0"])
    with pytest.raises(SystemExit, match=r"--seed-start=-1 is invalid"):
        main(["sandbox", "--seed-start", "-1"])
    with pytest.raises(SystemExit, match=r"max-gen-batches=0 is invalid: dapo_resample draws batches .* use 10"):
        main(["sandbox", "--estimators", "dapo_resample", "--max-gen-batches", "0"])
    # The estimator the user gave is named, not dapo_resample.
    with pytest.raises(SystemExit, match=r"--max-gen-batches=0 is invalid: grpo\+skip draws batches of") as refused:
        main(["sandbox", "--estimators", "grpo,grpo+skip", "--max-gen-batches", "0"])
    assert "dapo_resample" not in str(refused.value)
    with pytest.raises(SystemExit, match=r"--max-gen-batches=-1 is invalid: it caps .* \(none given here\); leave it"):
        main(["sandbox", "--estimators", "grpo", "--max-gen-batches", "-1"])
    with pytest.raises(SystemExit, match=r"temperature=0.0 is invalid: expected a positive number"):
        main(["sandbox", "--temperature", "0"])
    for ratio in ("-0.1", "1.5"):
        with pytest.raises(
            SystemExit, match=rf"lr_warmup_steps_ratio={ratio} is invalid: .* from 0 \(no warm-up\) to 1"
        ):
            main(["sandbox", "--lr-warmup-steps-ratio", ratio])
    # A pilot of 2 must be below G; the largest group, 2G, holds any G.
    with pytest.raises(SystemExit, match=r"--group-size=2 is invalid with grpo\+alloc: .* of at least 3, or drop"):
        main(["sandbox", "--estimators", "grpo,grpo+alloc", "--group-size", "2"])
    _check_allocation(33, parse_estimators("grpo+alloc"))


def test_cli_refuses_unwritable_folders_before_creating_any(tmp_path, monkeypatch):
    import verl_avspo.sandbox.loop as loop

    monkeypatch.setattr(loop, "train", lambda *a, **k: pytest.fail("the warm-up must not start"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(
        SystemExit, match=r"--out: cannot write .*a_file/sandbox: a part of the path is a file.*--out runs/sandbox"
    ):
        main(["sandbox", "--out", str(blocker / "sandbox"), "--cache-dir", str(tmp_path / "cache")])
    # A bad --cache-dir is refused before --out is created, and both bad folders are named at once.
    with pytest.raises(SystemExit, match=r"--cache-dir: cannot write .*a_file/cache: "):
        main(["sandbox", "--out", str(tmp_path / "new" / "out"), "--cache-dir", str(blocker / "cache")])
    assert not (tmp_path / "new").exists()
    with pytest.raises(
        SystemExit, match=r"(?s)--out: cannot write .*a_file/out: .*\n.*--cache-dir: cannot write .*a_file/cache"
    ):
        main(["sandbox", "--out", str(blocker / "out"), "--cache-dir", str(blocker / "cache")])


def _stats(accuracies):
    return [{"acc_mean": a, "acr": 0.4, "acr_effective": 0.1} for a in accuracies]


def test_verdict_follows_the_numbers():
    win, tie, loss = verdicts(
        {
            "grpo": _stats([0.50, 0.52, 0.48]),
            "avspo": _stats([0.60, 0.61, 0.59]),
            "rloo": _stats([0.55, 0.47, 0.50]),
            "dapo": _stats([0.40, 0.41, 0.39]),
        }
    )
    assert "`avspo` beat `grpo` here" in win and "+10.0 ± 0.6 points" in win and "higher in 3 of 3" in win
    assert "`rloo` did not beat `grpo` here" in tie
    assert "`dapo` did worse than `grpo` here" in loss
    assert "effective ACR was 0.100 against a raw ACR of 0.400" in win


def test_verdicts_use_the_studies_paired_t_test_not_twice_the_standard_error():
    """Gains of +1, +2, +4 points over 3 seeds: the mean (2.33) is 2.65 standard errors above 0, beyond twice
    its standard error, but a one-sided paired t-test with 2 degrees of freedom gives p = 0.059: not a win,
    as the studies' report script (the same tools.seed_stats.paired_t) would judge it."""
    (close,) = verdicts({"grpo": _stats([0.50, 0.50, 0.50]), "avspo": _stats([0.51, 0.52, 0.54])})
    p = paired_t(np.array([1.0, 2.0, 4.0]))["p"]
    assert p == pytest.approx(0.0588, abs=1e-3)
    assert f"one-sided paired t-test p = {p:.2g}" in close and "`avspo` did not beat `grpo` here" in close
    assert "nor did worse (p ≥ 0.05 each way)" in close


def test_plot_metrics(tmp_path):
    steps = pd.Index([1, 2, 3], name="step")
    seeds = [
        pd.DataFrame({"acr/rate": [0.5, 0.4, 0.3]}, index=steps),
        pd.DataFrame({"acr/rate": [0.3, 0.2, 0.1]}, index=steps),
    ]
    path = plot_metrics({"grpo": seeds, "avspo": seeds[0]}, ["acr/rate"], tmp_path / "a" / "acr.png", "ACR", "rate")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match=r"none of the columns \['eval/acc_mean'\]"):
        plot_metrics({"grpo": seeds}, ["eval/acc_mean"], tmp_path / "b.png", "t", "y")


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_log_probs_do_not_depend_on_padding(architecture):
    # Prompts of different lengths are left-padded together; each row's response log-probs must
    # equal those of the same row computed alone, without padding (positions, attention mask).
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.policy import CharTokenizer, build_model, response_log_probs, sample

    tokenizer = CharTokenizer()
    model = build_model(PolicyConfig(architecture=architecture, sft_steps=0), tokenizer).eval()
    rollout = sample(model, tokenizer, ["1+2=", "12+34=", "7*8="], 4, torch.Generator().manual_seed(0))
    assert rollout.prompt_mask[0, :2].tolist() == [0, 0]  # "1+2=" is padded to the longest prompt
    with torch.no_grad():
        batched = response_log_probs(model, rollout)
        for row in range(3):
            alone = rollout.select(torch.tensor([row]))
            start = int((alone.prompt_mask == 0).sum())
            unpadded = type(alone)(
                alone.prompt_ids[:, start:], alone.prompt_mask[:, start:], alone.response_ids, alone.response_mask
            )
            mask = alone.response_mask[0].bool()
            torch.testing.assert_close(response_log_probs(model, unpadded)[0][mask], batched[row][mask])
    assert (batched <= 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.5])
def test_log_probs_are_those_the_sampler_sampled_from(temperature):
    # PPO's old_log_prob must be log π of each sampled token under the distribution the sampler drew
    # it from: the logits of the prefix before it, at the sampling temperature. An off-by-one in the
    # logit slice or in the position ids would pass the padding test above but fail here, and so
    # would log-probs at temperature 1.0 of tokens sampled at another.
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.policy import CharTokenizer, build_model, response_log_probs, sample

    tokenizer = CharTokenizer()
    model = build_model(PolicyConfig(sft_steps=0), tokenizer).eval()
    rollout = sample(model, tokenizer, ["1+2=", "12+34=", "99*9="], 4, torch.Generator().manual_seed(0), temperature)
    with torch.no_grad():
        log_probs = response_log_probs(model, rollout, temperature)
        for t in range(rollout.response_ids.shape[1]):
            ids = torch.cat([rollout.prompt_ids, rollout.response_ids[:, :t]], dim=1)
            mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids[:, :t])], dim=1)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
            sampled_from = (logits[:, -1] / temperature).log_softmax(dim=-1)
            expected = sampled_from.gather(-1, rollout.response_ids[:, t : t + 1]).squeeze(-1)
            rows = rollout.response_mask[:, t].bool()
            torch.testing.assert_close(log_probs[rows, t], expected[rows])
    if temperature != 1.0:
        assert not torch.allclose(response_log_probs(model, rollout), log_probs, atol=1e-3)


def test_the_cached_sampler_decodes_as_full_forward_passes_do():
    # The sampler's KV cache must give each token the logits a full forward pass over the prompt and the
    # tokens so far gives (response_logits): greedy decoding picks their argmax at every response position,
    # on left-padded prompts of several lengths, with a warmed-up-like (non-uniform) random model.
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.policy import CharTokenizer, build_model, response_logits, sample

    tokenizer = CharTokenizer()
    model = build_model(PolicyConfig(sft_steps=0, seed=3), tokenizer).eval()
    prompts = ["1+2=", "12+34=", "99*9=", "123+45="]
    greedy = sample(model, tokenizer, prompts, 6, None)
    with torch.no_grad():
        full = response_logits(model, greedy)
    rows = greedy.response_mask.bool()
    assert torch.equal(full.argmax(dim=-1)[rows], greedy.response_ids[rows])
    assert greedy.response_ids.shape[1] > 1  # more than one token was decoded from the cache


def test_the_sampler_draws_from_the_tempered_distribution_with_its_own_generator():
    from verl_avspo.sandbox.policy import next_tokens

    logits = torch.tensor([[0.0, 1.0, 3.0, -1.0]]).expand(40_000, -1)
    for temperature in (1.0, 2.0):
        drawn = next_tokens(logits, torch.Generator().manual_seed(0), temperature)
        frequencies = torch.bincount(drawn, minlength=4) / len(drawn)
        torch.testing.assert_close(frequencies, torch.softmax(logits[0] / temperature, -1), atol=0.01, rtol=0)
    assert next_tokens(logits[:3], None).tolist() == [2, 2, 2]  # no generator: greedy
    # The draws come from the generator alone: torch's global one neither decides nor moves.
    state = torch.random.get_rng_state()
    first = next_tokens(logits[:500], torch.Generator().manual_seed(7))
    torch.manual_seed(123)
    assert torch.equal(next_tokens(logits[:500], torch.Generator().manual_seed(7)), first)
    torch.random.set_rng_state(state)


def test_a_response_ends_at_its_eos_and_is_padded_after_it():
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.policy import CharTokenizer, build_model, sample

    tokenizer = CharTokenizer()
    model = build_model(PolicyConfig(sft_steps=0), tokenizer).eval()
    rollout = sample(model, tokenizer, ["1+2="] * 64, 6, torch.Generator().manual_seed(0))
    is_eos = rollout.response_ids == tokenizer.eos_id
    ended = is_eos.any(dim=1)
    assert ended.any() and (~ended).any()  # a random model ends some responses within 6 tokens
    first = is_eos.int().argmax(dim=1)
    for row in ended.nonzero().squeeze(1).tolist():
        assert rollout.response_mask[row].tolist() == [1] * (first[row] + 1) + [0] * (6 - first[row] - 1)
        assert (rollout.response_ids[row, first[row] + 1 :] == tokenizer.pad_id).all()
    assert (rollout.response_mask[~ended] == 1).all()


def test_paper_baseline_specs():
    dcpo, intuitor, rent = parse_estimators("dcpo,intuitor,rent")
    assert (dcpo.dcpo, dcpo.reward, dcpo.intrinsic) == (True, "verifier", False)
    assert dcpo.algorithm_config(seed=0).adv_estimator == "dcpo"  # verl's dispatch, as registered
    assert (intuitor.reward, rent.reward) == ("self_certainty", "negative_entropy")
    assert intuitor.intrinsic and rent.intrinsic and not intuitor.dcpo
    assert intuitor.algorithm_config(seed=0).adv_estimator == "grpo"  # GRPO on the intrinsic reward
    with pytest.raises(ValueError, match="only avspo takes a preset"):
        parse_estimators("dcpo:paper")


def three_step_run(extra: dict) -> pd.DataFrame:
    """A one-level run's log as summary.py reads it: step 0 evaluated, steps 1-2 trained and 2 evaluated,
    with ``extra`` columns beside the ACR and evaluation ones."""
    columns = {
        "acr/rate": [None, 0.5, 0.25],
        "acr/effective": [None, 0.5, 0.25],
        "acr/all_correct": [None, 0.25, 0.0],
        "acr/all_wrong": [None, 0.25, 0.25],
        "eval/acc_level_1": [0.1, None, 0.5],
        "eval/acc_mean": [0.1, None, 0.5],
        "eval/pass@8_level_1": [0.2, None, 0.75],
    }
    return pd.DataFrame({**columns, **extra}, index=pd.Index([0, 1, 2], name="step"))


def test_summary_marks_intrinsic_rewards_and_shows_entropy():
    from verl_avspo.sandbox.summary import render_summary, run_statistics

    frame = three_step_run({"actor/entropy": [None, 1.5, 0.5]})
    stats = run_statistics(frame, 1, 8, 1)
    assert stats["entropy"] == 1.0 and stats["acr"] == 0.375
    old = run_statistics(frame.drop(columns="actor/entropy"), 1, 8, 1)  # a log from before the column
    text = render_summary({"grpo": [stats], "rent": [stats], "dcpo": [old]}, ["1+1"], 8, 1, "setup", [], ["rent"])
    assert "| `grpo` | 0.375 | 0.375 | 0.125 | 0.250 | 0.500 | 1.000 |" in text
    assert "| `rent` † | 0.375 |" in text and "| `dcpo` | 0.375 |" in text
    assert "| 0.500 | n/a |" in text  # dcpo's old log has no entropy
    assert "† `rent` train on an intrinsic reward" in text and "raw ACR is not comparable" in text
    assert "raw ACR of 0.375 (on its intrinsic reward: not comparable)." in text
    assert "`dcpo` vs `grpo`" in text and "raw ACR of 0.375." in text
    assert "†" not in render_summary({"grpo": [stats]}, ["1+1"], 8, 1, "setup", [])


def test_identical_answers_share_one_intrinsic_reward():
    from verl_avspo.sandbox.loop import _share_among_identical
    from verl_avspo.sandbox.policy import Rollout

    prompts = torch.tensor([[1, 5], [1, 5], [1, 5], [1, 6]])
    # Rows 0 and 1 are one answer (padding after <eos> differs); row 2 differs; row 3 is another prompt.
    responses = torch.tensor([[7, 2, 0], [7, 2, 9], [8, 2, 0], [7, 2, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]])
    rollout = Rollout(prompts, torch.ones_like(prompts), responses, mask)
    shared = _share_among_identical(torch.tensor([1.0, 1.0 + 3e-7, 2.0, 5.0]), rollout)
    assert shared[0] == shared[1] and shared[0].item() == pytest.approx(1.0 + 1.5e-7)
    assert shared[2:].tolist() == [2.0, 5.0]


def test_the_warm_up_cache_is_keyed_by_the_code_too(tmp_path, monkeypatch):
    # A cache written by other warm-up code must not be reused: edit a copy of the module's source.
    from verl_avspo.sandbox import policy
    from verl_avspo.sandbox.config import PolicyConfig
    from verl_avspo.sandbox.task import ArithmeticTask, parse_levels

    task, config, tokenizer = ArithmeticTask(parse_levels("1+1"), 8), PolicyConfig(), policy.CharTokenizer()
    key = policy._cache_key(config, task, tokenizer)
    assert policy._cache_key(config, task, tokenizer) == key
    edited = tmp_path / "policy.py"
    edited.write_text(Path(policy.__file__).read_text() + "\n# another warm-up\n")
    monkeypatch.setattr(policy, "__file__", str(edited))
    assert policy._cache_key(config, task, tokenizer) != key


def _scripted(*batches: str, group_size: int = 2):
    """A ``draw`` for dynamic_sampling over scripted batches: per group, ``c`` collapsed (all 1),
    ``i`` informative (0 then 1). Records which batch indices were drawn."""
    calls = []

    def draw(index: int):
        calls.append(index)
        rows = [[1.0] * group_size if kind == "c" else [0.0] + [1.0] * (group_size - 1) for kind in batches[index]]
        return SimpleNamespace(scores=torch.tensor(rows).reshape(-1))

    return draw, calls


def test_dynamic_sampling_keeps_exactly_the_wanted_non_collapsed_groups():
    draw, calls = _scripted("ccic", "icii", "iiii")
    drawn, picks = dynamic_sampling(draw, group_size=2, wanted=3, max_gen_batches=10)
    assert calls == [0, 1]  # stops as soon as it has 3 groups: batch 2 is never generated
    assert [p.tolist() for p in picks] == [
        [2],
        [0, 2],
    ]  # the first 3 in generation order; group 3 of batch 1 is surplus
    assert sum(len(b.scores) for b in drawn) == 16  # rollouts paid: every response of both batches, surplus included
    drawn, picks = dynamic_sampling(draw, group_size=2, wanted=1, max_gen_batches=10)
    assert len(drawn) == 1 and [p.tolist() for p in picks] == [[2]]
    # A full first batch costs no extra rollouts.
    drawn, picks = dynamic_sampling(_scripted("iiii")[0], group_size=2, wanted=4, max_gen_batches=10)
    assert len(drawn) == 1 and picks[0].tolist() == [0, 1, 2, 3]


def test_dynamic_sampling_stops_at_the_cap_with_what_it_has():
    draw, calls = _scripted("cccc", "ciic", "cccc", "iiii", group_size=4)
    drawn, picks = dynamic_sampling(draw, group_size=4, wanted=4, max_gen_batches=3)
    assert calls == [0, 1, 2]  # verl's max_num_gen_batches: at most 3 batches, then train on what there is
    assert [p.tolist() for p in picks] == [[], [1, 2], []]
    drawn, picks = dynamic_sampling(_scripted("cc", "cc")[0], group_size=2, wanted=2, max_gen_batches=2)
    assert len(drawn) == 2 and sum(p.numel() for p in picks) == 0  # all collapsed: nothing to train on


def test_dynamic_sampling_refuses_bad_settings():
    draw = _scripted("ii")[0]
    with pytest.raises(ValueError, match=r"wanted=0, max_gen_batches=10: both must be at least 1"):
        dynamic_sampling(draw, group_size=2, wanted=0, max_gen_batches=10)
    with pytest.raises(ValueError, match=r"wanted=2, max_gen_batches=0"):
        dynamic_sampling(draw, group_size=2, wanted=2, max_gen_batches=0)
    with pytest.raises(ValueError, match=r"max_gen_batches=-1 is invalid"):
        SandboxConfig(max_gen_batches=-1)
    assert parse_estimators("dapo,dapo_resample")[1].resample  # filtering and re-sampling are two estimators


def test_rollouts_concatenate_with_prompts_left_padded_and_responses_right_padded():
    short = Rollout(torch.tensor([[5, 6]]), torch.tensor([[1, 1]]), torch.tensor([[7]]), torch.tensor([[1]]))
    long = Rollout(torch.tensor([[4, 5, 6]]), torch.tensor([[1, 1, 1]]), torch.tensor([[8, 9]]), torch.tensor([[1, 1]]))
    both = Rollout.concat([short, long], pad_id=0)
    assert both.prompt_ids.tolist() == [[0, 5, 6], [4, 5, 6]] and both.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert both.response_ids.tolist() == [[7, 0], [8, 9]] and both.response_mask.tolist() == [[1, 0], [1, 1]]


def test_skip_specs():
    grpo, avspo, resample = parse_estimators("grpo+skip,avspo:paper_code+skip,dapo_resample+skip")
    assert (grpo.label, grpo.adv_estimator, grpo.skip) == ("grpo+skip", "grpo", True)
    assert (avspo.preset, avspo.skip) == ("paper_code", True) and resample.resample and resample.skip
    assert grpo.prompt_skip(seed=7).enable and grpo.prompt_skip(seed=7).seed == 7
    assert parse_estimators("grpo")[0].prompt_skip(seed=7) is None
    assert len(parse_estimators("grpo,grpo+skip")) == 2
    with pytest.raises(ValueError, match="are one estimator"):
        parse_estimators("avspo+skip,avspo:paper+skip")
    with pytest.raises(ValueError, match=r"<estimator>\+skip"):
        parse_estimators("grpo+skipp")


def test_draw_kept_fills_the_step_and_the_last_draw_keeps_what_is_missing():
    numbers = iter(range(1000))

    def draw():
        prompts = [str(next(numbers)) for _ in range(4)]
        return Problems(prompts, prompts, torch.zeros(4, dtype=torch.long))

    calls = []

    def keep_even(prompts, at_least, refill):
        calls.append(at_least)
        mask = torch.tensor([int(p) % 2 == 0 for p in prompts]).numpy()
        mask[(~mask).nonzero()[0][: max(0, at_least - int(mask.sum()))]] = True
        return mask

    assert draw_kept(draw, keep_even, 4, 10).prompts == ["0", "2", "4", "6"]  # two draws, none missing
    assert calls == [0, 0]
    calls.clear()
    assert draw_kept(draw, keep_even, 5, 2).prompts == ["8", "10", "12", "13", "14"]  # the 2nd (last) draw tops up
    assert calls == [0, 3]
    calls.clear()
    # DAPO's batches: one place filled, the others left open (its next batch tops up only if needed).
    assert draw_kept(draw, keep_even, 4, 10, fill=1).prompts == ["16", "18"]
    assert draw_kept(draw, keep_even, 4, 10, fill=1).prompts == ["20", "22"]


def test_the_training_set_is_drawn_once_evenly_over_levels_without_repeats():
    task = ArithmeticTask(parse_levels("1+1,2+1,1*1"), 8)
    problems = task.training_set(100, torch.Generator().manual_seed(3))
    assert torch.bincount(problems.level).tolist() == [34, 33, 33]  # the first level takes the remainder
    assert len(set(problems.prompts)) == 100
    held_out = {p for i in range(3) for p in task.eval_set(i).prompts}
    assert not set(problems.prompts) & held_out
    again = task.training_set(100, torch.Generator().manual_seed(3))
    assert again.prompts == problems.prompts  # determined by the seed
    assert task.training_set(100, torch.Generator().manual_seed(4)).prompts != problems.prompts


@given(
    size=st.integers(0, 400),
    pools=st.lists(st.integers(0, 200), min_size=1, max_size=5),
)
def test_level_shares_are_even_as_far_as_each_pool_goes(size, pools):
    """Water-filling: the shares sum to the set, none exceeds its pool, and a level below its pool takes
    at least as many as any other level (within the one-prompt remainder), so only full levels take fewer."""
    if size > sum(pools):
        with pytest.raises(ValueError, match="exceed the training pools"):
            level_shares(size, pools)
        return
    shares = level_shares(size, pools)
    assert sum(shares) == size and all(0 <= s <= p for s, p in zip(shares, pools, strict=True))
    for share, pool in zip(shares, pools, strict=True):
        if share < pool:
            assert share >= max(shares) - 1


def test_a_small_level_gives_its_whole_pool_and_the_others_share_the_rest():
    # 1+1 keeps 40 problems for RL at the defaults (100, 20 held out, half of the rest warm-up).
    assert level_shares(480, [40, 340, 3950, 340]) == [40, 147, 147, 146]
    assert level_shares(100, [34, 33, 33]) == [34, 33, 33]
    task = ArithmeticTask(parse_levels("1+1,2+1"), 8)  # 1+1: 100 - 8 = 92, 46 for RL
    problems = task.training_set(200, torch.Generator().manual_seed(0))
    assert torch.bincount(problems.level).tolist() == [46, 154] and len(set(problems.prompts)) == 200


def test_each_epoch_is_a_permutation_of_the_set_and_draws_run_on_into_the_next():
    task = ArithmeticTask(parse_levels("1+1,2+1"), 8)
    epochs = TrainingEpochs(task, 24, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    draws = [epochs.sample(8, generator).prompts for _ in range(9)]  # 3 epochs of 3 draws
    for epoch in range(3):
        seen = [p for draw in draws[3 * epoch : 3 * epoch + 3] for p in draw]
        assert sorted(seen) == sorted(epochs.problems.prompts)  # each prompt exactly once per epoch
    assert epochs.epoch == 3 and draws[:3] != draws[3:6]  # a fresh permutation each epoch
    assert epochs.max_answer_chars == task.max_answer_chars
    # A draw that straddles two epochs takes the end of one and the start of the next.
    odd = TrainingEpochs(task, 24, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    first, second = odd.sample(20, generator).prompts, odd.sample(8, generator).prompts
    assert sorted(first + second[:4]) == sorted(odd.problems.prompts) and odd.epoch == 2
    # Same seeds, same draws.
    replay = TrainingEpochs(task, 24, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    assert [replay.sample(8, generator).prompts for _ in range(9)] == draws


def test_the_skip_rules_refills_come_from_the_current_epoch():
    task = ArithmeticTask(parse_levels("1+1"), 8)
    epochs = TrainingEpochs(task, 32, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    candidates = []

    def draw():
        candidates.append(epochs.sample(8, generator))
        return candidates[-1]

    def keep_first_half(prompts, at_least, *_):  # the rule keeps half of each candidate batch
        mask = torch.zeros(len(prompts), dtype=torch.bool)
        mask[: max(len(prompts) // 2, at_least)] = True
        return mask.numpy()

    kept = draw_kept(draw, keep_first_half, 8, 10)
    assert len(kept.prompts) == 8 and len(candidates) == 2  # the refill drew the next 8 of the epoch
    assert len(set(candidates[0].prompts + candidates[1].prompts)) == 16 and epochs.epoch == 1
    draw_kept(draw, keep_first_half, 8, 10)  # the next step's draws finish the epoch
    assert sorted(p for c in candidates for p in c.prompts) == sorted(epochs.problems.prompts)


def test_the_training_set_is_validated_with_the_numbers_and_warns_below_five_epochs():
    with pytest.raises(ValueError, match=r"train_set=8 is invalid: a step draws prompts_per_step=16 .* at least 16"):
        SandboxConfig(train_set=8)
    # 1+1 keeps 40 of its 100 problems for RL (a fifth held out, half the rest for the warm-up): 41 prompts
    # over 1 level are too many.
    with pytest.raises(
        ValueError, match=r"train_set=41 is too large .* pools hold 40 problems \(1\+1 40\); use at most 40"
    ):
        SandboxConfig(levels="1+1", train_set=41)
    with pytest.warns(UserWarning, match=r"steps=20 x prompts_per_step=16 = 320 .* each prompt 2 time.*<= 64"):
        SandboxConfig(steps=20, train_set=128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SandboxConfig(steps=20, train_set=64)  # 320 draws: each prompt 5 times
    # 4 steps x 16 = 64 draws: a set of 64 // 5 = 12 cannot fill a step, so only the steps are advised; the
    # warning points at the caller's line, not at the dataclass's generated __init__ ("<string>").
    with pytest.warns(UserWarning, match=r"fewer than 5 epochs: use steps >= 20$") as caught:
        SandboxConfig(steps=4, train_set=64)
    assert caught[0].filename == __file__
    with pytest.raises(SystemExit, match=r"train_set=8 is invalid"):
        main(["sandbox", "--train-set", "8"])
    from verl_avspo.sandbox.setup_text import _prompts_text

    assert "a fixed training set of 128 prompts" in _prompts_text(SandboxConfig(train_set=128))
    assert "each prompt seen at least 7 times" in _prompts_text(SandboxConfig(steps=60, train_set=128))  # 960 / 128
    assert "with replacement" in _prompts_text(SandboxConfig())


def test_the_summary_reports_the_training_prompts_shares_at_the_end_of_the_run():
    from verl_avspo.sandbox.summary import render_summary, run_statistics

    frame = three_step_run(
        {
            "prompts/seen": [None, 16, 32],
            "prompts/always_solved": [None, 0.5, 0.25],
            "prompts/never_solved": [None, 0.125, 0.0625],
        }
    )
    stats = run_statistics(frame, 1, 8, 1)
    assert (stats["prompts_seen"], stats["prompts_always_solved"], stats["prompts_never_solved"]) == (32, 0.25, 0.0625)
    text = render_summary({"grpo": [stats]}, ["1+1"], 8, 1, "setup", [])
    assert "### Training prompts at the end of the run" in text and "| `grpo` | 32 | 0.250 | 0.062 |" in text
    older = run_statistics(
        frame.drop(columns=["prompts/seen", "prompts/always_solved", "prompts/never_solved"]), 1, 8, 1
    )
    assert "Training prompts" not in render_summary({"grpo": [older]}, ["1+1"], 8, 1, "setup", [])
