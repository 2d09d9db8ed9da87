"""``strategy: beta`` (docs/method.md §6): Beta-prior pseudo-counts and a leave-one-out posterior-mean
baseline. Closed forms for Jeffreys and Laplace, the fitted prior, the errors, verl's own
``compute_advantage``, and a Monte Carlo check on a toy bandit that its expected policy gradient is
the true one where the paper's estimator's is not."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from helpers import group_uids, outcome_batch, outcome_data
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_avspo.core.config import PRESETS, resolve_settings
from verl_avspo.core.prior import BetaPrior, fit_beta_prior
from verl_avspo.core.run_tracker import RunTracker

EPS = 1e-6


def beta(scores, sizes, norm=True, **settings):
    """Run the estimator on one batch: ``scores`` (bs,), consecutive groups of ``sizes``."""
    cfg, acr = resolve_settings({"preset": "beta_loo", **settings})
    rewards, mask = outcome_batch(torch.as_tensor(scores, dtype=torch.float64))
    tracker = RunTracker(acr, cfg)  # the run's step owner, so that metrics hold acr/* too
    output = tracker.avspo_advantages(rewards, mask, group_uids(sizes), norm)
    return dataclasses.replace(output, metrics=tracker.end_step(1, output.scalar_advantages))


def reference(x, sizes, a, b, baseline):
    """Leave-one-out (or whole-group) posterior means computed by literally removing each response."""
    out, start = [], 0
    for n in sizes:
        group = x[start : start + n]
        for i in range(n):
            pool = [v for j, v in enumerate(group) if j != i] if baseline == "loo" else group
            mean = (a + sum(pool)) / (a + b + len(pool))
            out.append((group[i] - mean, math.sqrt(mean * (1 - mean))))
        start += n
    return out


# --- closed forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(("prior", "a", "b"), [("jeffreys", 0.5, 0.5), ("laplace", 1.0, 1.0)])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_collapsed_groups_closed_form(prior, a, b, n):
    out = beta([1.0] * n + [0.0] * n, [n, n], prior=prior).scalar_advantages
    # All correct: b_i = (a + n - 1)/(a + b + n - 1), so A = (1 - b_i)/sqrt(b_i (1 - b_i)) = sqrt(b/(a + n - 1)).
    b_correct = (a + n - 1) / (a + b + n - 1)
    expected = (1 - b_correct) / (math.sqrt(b_correct * (1 - b_correct)) + EPS)
    assert math.isclose(expected, math.sqrt(b / (a + n - 1)), rel_tol=1e-4)
    torch.testing.assert_close(out[:n], torch.full((n,), expected, dtype=torch.float64))
    # All wrong: b_i = a/(a + b + n - 1), A = -sqrt(a/(b + n - 1)).
    torch.testing.assert_close(
        out[n:], torch.full((n,), -math.sqrt(a / (b + n - 1)), dtype=torch.float64), rtol=1e-5, atol=0
    )
    if (prior, n) == ("jeffreys", 8):
        assert round(float(out[0]), 4) == 0.2582  # docs/method.md §6: sqrt(1/15)


def test_mixed_group_closed_form_and_group_baseline():
    n, k, a = 8, 3, 0.5  # Jeffreys, 3 of 8 correct
    loo = beta([1.0] * k + [0.0] * (n - k), [n]).scalar_advantages
    b_correct, b_wrong = (a + k - 1) / (1 + n - 1), (a + k) / (1 + n - 1)
    assert math.isclose(loo[0], (1 - b_correct) / (math.sqrt(b_correct * (1 - b_correct)) + EPS), rel_tol=1e-12)
    assert math.isclose(loo[-1], -b_wrong / (math.sqrt(b_wrong * (1 - b_wrong)) + EPS), rel_tol=1e-12)
    group = beta([1.0] * k + [0.0] * (n - k), [n], baseline="group").scalar_advantages
    p = (a + k) / (1 + n)  # one posterior mean for the whole group
    assert math.isclose(group[0], (1 - p) / (math.sqrt(p * (1 - p)) + EPS), rel_tol=1e-12)
    assert math.isclose(group[-1], -p / (math.sqrt(p * (1 - p)) + EPS), rel_tol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    prior=st.sampled_from(["jeffreys", "laplace"]),
    baseline=st.sampled_from(["loo", "group"]),
    norm=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_equals_a_literal_leave_one_out(sizes, prior, baseline, norm, seed):
    """Continuous rewards on reward_range [-1, 2], singletons included (their LOO baseline is the prior mean)."""
    a = b = {"jeffreys": 0.5, "laplace": 1.0}[prior]
    gen = torch.Generator().manual_seed(seed)
    scores = -1.0 + 3.0 * torch.rand(sum(sizes), generator=gen, dtype=torch.float64)
    scores = torch.where(torch.rand(len(scores), generator=gen) < 0.3, scores.round().clamp(-1, 2), scores)
    out = beta(scores, sizes, norm, prior=prior, baseline=baseline, reward_range=[-1.0, 2.0]).scalar_advantages
    x = ((scores + 1.0) / 3.0).tolist()
    centred, scale = zip(*reference(x, sizes, a, b, baseline), strict=True)
    centred, scale = torch.tensor(centred, dtype=torch.float64), torch.tensor(scale, dtype=torch.float64)
    expected = centred / (scale + EPS) if norm else 3.0 * centred
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_correct_weight_scales_only_all_correct_collapsed_groups():
    scores, sizes = [1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 1.0, 1.0], [4, 4, 4]
    full = beta(scores, sizes)
    half = beta(scores, sizes, correct_weight=0.5)
    off = beta(scores, sizes, correct_weight=0.0)
    torch.testing.assert_close(half.scalar_advantages[:4], full.scalar_advantages[:4] / 2)
    torch.testing.assert_close(half.scalar_advantages[4:], full.scalar_advantages[4:])
    assert torch.all(off.scalar_advantages[:4] == 0)
    torch.testing.assert_close(off.scalar_advantages[4:], full.scalar_advantages[4:])
    assert full.metrics["acr/effective"] == 0.0 and full.metrics["avspo/triggered"] == pytest.approx(2 / 3)
    assert off.metrics["acr/effective"] == pytest.approx(1 / 3) and off.metrics["avspo/triggered"] == pytest.approx(
        1 / 3
    )
    assert full.augmented.tolist() == [True, True, False] and off.augmented.tolist() == [False, True, False]


# --- the fitted prior --------------------------------------------------------------------------


def fit(successes, sizes, strength_max=8.0):
    return fit_beta_prior(torch.tensor(successes, dtype=torch.float64), torch.tensor(sizes), strength_max)


def test_fitted_prior_method_of_moments_by_hand():
    # Rates 0, 1, 1/2, 1/4, 3/4 of n = 4: mean 1/2, Var(m) = 5/32, binomial noise mean(m(1-m)/3) = 1/24,
    # so sigma^2 = 11/96 and a + b = (1/4)/(11/96) - 1 = 13/11. A singleton (last) is left out of the fit.
    prior = fit([0, 4, 2, 1, 3, 1], [4, 4, 4, 4, 4, 1])
    assert prior.a == pytest.approx(13 / 22, rel=1e-12) and prior.b == pytest.approx(13 / 22, rel=1e-12)


def test_fitted_prior_cap_and_floors():
    # Rates 1/4, 5/8, 3/8, 3/4 of n = 8: sigma^2 = 0.0520833 - 0.0301339 and a + b = 10.39 by the moments.
    moments = 0.25 / (0.15625 / 3 - 0.2109375 / 7) - 1
    assert fit([2, 5, 3, 6], [8] * 4, strength_max=20).strength == pytest.approx(moments, rel=1e-12)
    assert fit([2, 5, 3, 6], [8] * 4, strength_max=8) == BetaPrior(4.0, 4.0)  # capped, mean kept
    # No spread beyond binomial noise: the cap.
    assert fit([1, 2, 2, 3], [4] * 4, strength_max=3) == BetaPrior(1.5, 1.5)
    # Every response wrong: a would be 0; the floor keeps it at 1/2 so the posterior stays proper.
    assert fit([0, 0, 0], [8] * 3) == BetaPrior(0.5, 8.0)
    # Over-dispersed (half the prompts all correct, half all wrong): no shrinkage beyond Jeffreys.
    assert fit([8, 0, 8, 0], [8] * 4) == BetaPrior(0.5, 0.5)
    # Fewer than two groups with n >= 2 say nothing about the spread: Jeffreys.
    assert fit([3, 1], [8, 1]) == BetaPrior(0.5, 0.5)


@settings(max_examples=40, deadline=None)
@given(
    successes=st.lists(st.integers(0, 6), min_size=2, max_size=12),
    strength_max=st.floats(0.5, 50.0),
)
def test_fitted_prior_matches_numpy_moments(successes, strength_max):
    rates = np.array(successes) / 6
    spread = rates.var(ddof=1) - np.mean(rates * (1 - rates) / 5)
    mean = rates.mean()
    strength = strength_max if spread <= 0 else min(max(mean * (1 - mean) / spread - 1, 0.0), strength_max)
    prior = fit(successes, [6] * len(successes), strength_max)
    assert prior.a == pytest.approx(max(mean * strength, 0.5), rel=1e-9, abs=1e-12)
    assert prior.b == pytest.approx(max((1 - mean) * strength, 0.5), rel=1e-9, abs=1e-12)


def test_fitted_prior_drives_the_advantage():
    scores = [0.0, 0.0, 0.0, 0.0] + [1.0, 1.0, 1.0, 1.0] + [1.0, 1.0, 0.0, 0.0] * 2
    out = beta(scores, [4, 4, 4, 4], prior="fitted", prior_strength_max=2.0)
    prior = fit([0, 4, 2, 2], [4] * 4, strength_max=2.0)
    assert out.metrics["avspo/prior_strength"] == pytest.approx(prior.strength)
    assert out.metrics["avspo/prior_mean"] == pytest.approx(prior.mean)
    centred, scale = zip(*reference(scores, [4] * 4, prior.a, prior.b, "loo"), strict=True)
    expected = torch.tensor(centred, dtype=torch.float64) / (torch.tensor(scale, dtype=torch.float64) + EPS)
    torch.testing.assert_close(out.scalar_advantages, expected)


# --- settings ----------------------------------------------------------------------------------


def test_presets():
    loo, fitted = resolve_settings({"preset": "beta_loo"})[0], resolve_settings({"preset": "beta_fitted"})[0]
    assert (loo.strategy, loo.prior, loo.baseline, loo.correct_weight) == ("beta", "jeffreys", "loo", 1.0)
    assert (fitted.strategy, fitted.prior, fitted.baseline) == ("beta", "fitted", "loo")
    assert resolve_settings({"preset": "beta_loo", "prior": "laplace"})[0].prior == "laplace"
    paper = resolve_settings({})[0]  # the paper stays the default
    assert (paper.preset, paper.strategy) == ("paper", "stratified")
    # A resolved config lists every key at its preset value and still resolves to itself.
    for preset in PRESETS:
        for extra in ({}, {"strategy": "beta"}) if preset != "grpo" else ({},):  # grpo + beta: refused
            resolved = resolve_settings({"preset": preset, **extra})[0]
            assert resolve_settings(resolved.to_dict())[0] == resolved


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"preset": "beta_loo", "prior": "uniform"},
            r"prior='uniform' is invalid: allowed values are jeffreys, laplace, fitted",
        ),
        ({"preset": "beta_loo", "baseline": "rloo"}, r"baseline='rloo' is invalid: allowed values are loo, group"),
        (
            {"preset": "beta_fitted", "prior_strength_max": 0},
            r"prior_strength_max=0 is invalid: expected a finite number > 0.0",
        ),
        (
            {"preset": "beta_fitted", "prior_strength_max": float("inf")},
            r"prior_strength_max=inf is invalid: expected a finite",
        ),
        ({"preset": "beta_fitted", "prior_strength_max": "8"}, r"prior_strength_max='8' is invalid: expected a finite"),
        (
            {"preset": "beta_loo", "correct_weight": -0.5},
            r"correct_weight=-0.5 is invalid: expected a number in \[0.0, 1000000.0\]",
        ),
        (
            {"preset": "beta_loo", "correct_weight": 1e39},  # would overflow float32 at the first step
            r"correct_weight=1e\+39 is invalid: expected a number in \[0.0, 1000000.0\]",
        ),
        (
            {"preset": "beta_loo", "prior_strength_max": 2},
            r"prior_strength_max=2 is invalid: it caps only the fitted prior's strength; set prior=fitted",
        ),
        (
            {"preset": "grpo", "strategy": "beta"},
            r"strategy='beta' is invalid: the grpo preset is plain GRPO, but strategy=beta adds prior pseudo-counts",
        ),
        ({"preset": "beta_loo", "correct_weight": True}, r"correct_weight=True is invalid: expected a finite number"),
        ({"strategy": "betta"}, r"strategy='betta' is invalid: allowed values are stratified, .*, beta"),
        (
            {"prior": "fitted"},
            r"algorithm.avspo.prior='fitted' is invalid: it applies only with strategy=beta, and strategy is "
            r"'stratified'; set strategy=beta \(or preset=beta_loo\), or remove it",
        ),
        (
            {"preset": "paper_code", "correct_weight": 0.5},
            r"correct_weight=0.5 is invalid: it applies only with strategy=beta",
        ),
        (
            {"preset": "beta_loo", "k": 4},
            r"k=4 is invalid: strategy=beta adds prior pseudo-counts to every group and reads no virtual-sample "
            r"setting \(gap, apply_to, k, alpha, trigger_scope\); remove it "
            r"\(to weight the all-correct half, use correct_weight\)",
        ),
        ({"strategy": "beta", "apply_to": "all_wrong"}, r"apply_to='all_wrong' is invalid: strategy=beta adds"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        resolve_settings(settings)


def test_the_fitted_prior_cap_is_accepted_where_it_applies():
    assert resolve_settings({"preset": "beta_fitted", "prior_strength_max": 2})[0].prior_strength_max == 2
    assert resolve_settings({"preset": "beta_loo", "prior": "fitted", "prior_strength_max": 2})[0].prior == "fitted"


@pytest.mark.verl
def test_through_verl_compute_advantage_with_the_sandbox_spec():
    """verl's own dispatch (registry, DataProto) with the config the sandbox builds for avspo:beta_loo."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from verl_avspo.sandbox.estimators import parse_estimators
    from verl_avspo.verl_plugin import run_state

    (spec,) = parse_estimators("avspo:beta_loo")
    run_state.reset()
    rewards, mask = outcome_batch([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], length=5)
    mask[0, 3:] = 0
    data = outcome_data(rewards, mask, group_uids([4, 4], "q"))
    out = compute_advantage(data, spec.adv_estimator, config=spec.algorithm_config(seed=0))
    adv = out.batch["advantages"]
    # q0 collapsed all correct, n = 4, Jeffreys: A = sqrt(b/(a + n - 1)) = sqrt(0.5/3.5).
    torch.testing.assert_close(adv[1:4, 0], torch.full((3,), math.sqrt(0.5 / 3.5)), rtol=1e-5, atol=1e-6)
    assert torch.all(adv[0, 3:] == 0) and torch.equal(out.batch["returns"], adv)
    # q1, 1 of 4 correct: the correct answer's baseline is (0.5 + 0)/(1 + 3), a wrong one's (0.5 + 1)/4.
    b_right, b_wrong = 0.5 / 4, 1.5 / 4
    assert adv[5, 0].item() == pytest.approx((1 - b_right) / math.sqrt(b_right * (1 - b_right)), rel=1e-5)
    assert adv[4, 0].item() == pytest.approx(-b_wrong / math.sqrt(b_wrong * (1 - b_wrong)), rel=1e-5)
    metrics = run_state.tracker_for(spec.algorithm_config(seed=0), spec.adv_estimator).end_step(1, adv)
    assert metrics["acr/rate"] == 0.5 and metrics["acr/effective"] == 0.0
    assert metrics["avspo/prior_strength"] == 1.0 and metrics["avspo/prior_mean"] == 0.5


# --- Monte Carlo: expected policy gradient on a toy bandit -------------------------------------

GROUPS, N = 40_000, 8
# Three prompts (easy, medium, hard), each with its own softmax policy over three arms.
LOGITS = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 2.0]], dtype=torch.float64)


def bandit(settings, norm, values, outcome_probs, seed=0):
    """Per-prompt expected score-function gradient of one estimator, and the true gradient.

    Args:
        values: (V,) the possible rewards; outcome_probs: (Q, A, V) their probabilities per arm.

    Returns:
        along: (Q, 2) mean and standard error of <g, ∇J_q>/|∇J_q|² (1 for the true gradient);
        across: (Q, 2) the same for the component of g orthogonal to ∇J_q (0 for the true gradient);
        success: (Q,) J_q; metrics of the estimator.
    """
    gen = torch.Generator().manual_seed(seed)
    prompts, arms_count = LOGITS.shape
    policy = LOGITS.softmax(-1)
    prompt = torch.arange(prompts).repeat_interleave(GROUPS)
    arms = torch.multinomial(policy[prompt], N, replacement=True, generator=gen)  # (Q*M, n)
    outcome = torch.multinomial(outcome_probs[prompt.unsqueeze(1), arms].reshape(-1, len(values)), 1, generator=gen)
    rewards = values[outcome.reshape(-1)]
    cfg, acr = resolve_settings(settings)
    index = torch.arange(prompts * GROUPS).repeat_interleave(N)
    tracker = RunTracker(acr, cfg)
    out = tracker.avspo_advantages(rewards.unsqueeze(1), torch.ones(len(rewards), 1), index, norm)
    out = dataclasses.replace(out, metrics=tracker.end_step(1, out.scalar_advantages))
    # Score function of a softmax policy: d log pi(a)/d logits = onehot(a) - pi.
    score = torch.nn.functional.one_hot(arms, arms_count).to(torch.float64) - policy[prompt].unsqueeze(1)
    grad = (out.scalar_advantages.reshape(-1, N, 1) * score).mean(dim=1).reshape(prompts, GROUPS, arms_count)
    mean_reward = outcome_probs @ values  # (Q, A)
    success = (policy * mean_reward).sum(-1)
    true = policy * (mean_reward - success.unsqueeze(1))  # dJ_q/d logits_q
    normal = torch.linalg.cross(torch.ones_like(true), true)  # orthogonal to ∇J_q and to the all-ones direction
    normal = normal / normal.norm(dim=-1, keepdim=True)
    along = grad @ true.unsqueeze(-1) / true.norm(dim=-1, keepdim=True).pow(2).unsqueeze(-1)
    across = grad @ normal.unsqueeze(-1) / true.norm(dim=-1, keepdim=True).unsqueeze(-1)

    def mean_and_error(v):
        v = v.squeeze(-1)
        return torch.stack([v.mean(dim=1), v.std(dim=1) / math.sqrt(GROUPS)], dim=1)

    return mean_and_error(along), mean_and_error(across), success, out.metrics


BINARY = torch.tensor([0.0, 1.0], dtype=torch.float64)
ARM_SUCCESS = torch.tensor([[0.99, 0.6, 0.2], [0.9, 0.5, 0.1], [0.9, 0.3, 0.0]], dtype=torch.float64)
BERNOULLI = torch.stack([1 - ARM_SUCCESS, ARM_SUCCESS], dim=-1)
# The paper's estimator in a step where it triggers: theta below this batch's ACR (about 0.38).
PAPER_TRIGGERED = {"preset": "paper", "threshold_init": 0.1}


def dr_grpo_weight(success, n, push):
    """Binary rewards, A = r - mean of the group: per prompt E[g] = w ∇J with w = 1 - 1/n, plus the
    virtual push (|A| = push) that a collapsed group gets: all correct with prob J^(n-1) given r_i = 1,
    all wrong with prob (1 - J)^(n-1) given r_i = 0."""
    return 1 - 1 / n + (success ** (n - 1) + (1 - success) ** (n - 1)) * push


def test_loo_expected_gradient_is_the_true_gradient_and_the_papers_is_not():
    """Without std normalisation (verl's norm_adv_by_std_in_grpo=false) the LOO estimator's expected
    gradient is exactly ∇J on every prompt. The paper's is (1 - 1/n)∇J plus a push that grows with
    J^(n-1) + (1 - J)^(n-1): easy and hard prompts get more weight than medium ones, so it is not
    ∇J even up to a common scale, beyond Monte Carlo error, where a third of the groups collapse."""
    along, across, success, metrics = bandit({"preset": "beta_loo"}, False, BINARY, BERNOULLI)
    assert 0.3 < metrics["acr/rate"] < 0.5
    assert torch.all((along[:, 0] - 1).abs() < 4.5 * along[:, 1]), along
    assert torch.all(across[:, 0].abs() < 4.5 * across[:, 1]), across

    code, _, _, _ = bandit({"preset": "paper_code"}, False, BINARY, BERNOULLI)
    assert torch.all((code[:, 0] - dr_grpo_weight(success, N, 1 / (N + 1))).abs() < 4.5 * code[:, 1]), code
    assert torch.all(1 - code[:, 0] > 6 * code[:, 1])
    easy_minus_medium = code[0, 0] - code[1, 0]
    assert easy_minus_medium > 6 * math.hypot(code[0, 1], code[1, 1])

    paper, _, _, metrics = bandit(PAPER_TRIGGERED, False, BINARY, BERNOULLI)
    k = metrics["avspo/virtual_k"]
    assert metrics["avspo/triggered"] == metrics["acr/rate"] and k == 5
    push = 0.1 * (k + 1) / (2 * (N + k))  # stratified, gap 0.1: 1 - mean of (n ones and K values 1 - 0.1 k/K)
    assert torch.all((paper[:, 0] - dr_grpo_weight(success, N, push)).abs() < 4.5 * paper[:, 1]), paper
    assert torch.all(1 - paper[:, 0] > 6 * paper[:, 1])


def test_loo_with_posterior_std_is_the_true_gradient_times_a_known_prompt_weight():
    """With std normalisation each prompt's expected LOO gradient is w(J_q) ∇J_q, with
    w(J) = E[1/(sqrt(b(1 - b)) + eps)] over the other n - 1 responses (b does not depend on r_i)."""
    along, across, success, _ = bandit({"preset": "beta_loo"}, True, BINARY, BERNOULLI)
    k = torch.arange(N, dtype=torch.float64)
    binomial = torch.exp(torch.lgamma(torch.tensor(N, dtype=torch.float64)) - torch.lgamma(k + 1) - torch.lgamma(N - k))
    baseline = (0.5 + k) / N  # Jeffreys, n - 1 others
    inverse_scale = 1 / ((baseline * (1 - baseline)).sqrt() + EPS)
    weight = (binomial * success.unsqueeze(1) ** k * (1 - success.unsqueeze(1)) ** (N - 1 - k) * inverse_scale).sum(1)
    assert torch.all((along[:, 0] - weight).abs() < 4.5 * along[:, 1]), (along, weight)
    assert torch.all(across[:, 0].abs() < 4.5 * across[:, 1]), across


def test_with_partial_credit_only_loo_keeps_the_gradient_direction():
    """Rewards 0, 1/2, 1 from deterministic arms, std normalisation (the default): the LOO update is
    parallel to ∇J on every prompt. The paper's estimator, whose baseline and scale depend on r_i
    through the group mean and std, tilts it on the easy and hard prompts by far more than MC error."""
    values = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    deterministic = torch.eye(3, dtype=torch.float64).flip(0).expand(3, 3, 3)  # arm 0 -> 1, arm 1 -> 1/2, arm 2 -> 0
    _, across, _, metrics = bandit({"preset": "beta_loo"}, True, values, deterministic)
    assert metrics["acr/rate"] > 0.2
    assert torch.all(across[:, 0].abs() < 4.5 * across[:, 1]), across
    for settings_ in ({"preset": "paper_code"}, PAPER_TRIGGERED):
        _, tilted, _, _ = bandit(settings_, True, values, deterministic)
        assert tilted[0, 0].abs() > 10 * tilted[0, 1] and tilted[2, 0].abs() > 10 * tilted[2, 1], (settings_, tilted)
