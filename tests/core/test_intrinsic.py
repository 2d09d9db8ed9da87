"""INTUITOR's self-certainty and RENT's entropy reward on hand-computed distributions."""

import math

import pytest
import torch

from verl_avspo.core.intrinsic import (
    masked_token_mean,
    negative_entropy,
    self_certainty,
    token_entropy,
    token_self_certainty,
)


def _logits_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def test_uniform_and_peaked_distributions():
    vocab = 4
    uniform = torch.zeros(1, 1, vocab)
    assert token_self_certainty(uniform).item() == pytest.approx(0.0, abs=1e-6)
    assert token_entropy(uniform).item() == pytest.approx(math.log(vocab))
    # p = (1/2, 1/4, 1/8, 1/8): H = 1.75 ln 2; KL(U || p) = -ln 4 - (1/4)(ln 1/2 + ln 1/4 + 2 ln 1/8).
    peaked = _logits_of([[[0.5, 0.25, 0.125, 0.125]]])
    assert token_entropy(peaked).item() == pytest.approx(1.75 * math.log(2), rel=1e-6)
    kl = -math.log(4) + (math.log(2) + math.log(4) + 2 * math.log(8)) / 4
    assert token_self_certainty(peaked).item() == pytest.approx(kl, rel=1e-6)
    assert kl == pytest.approx(0.25 * math.log(2))
    # Almost one-hot: entropy -> 0, self-certainty -> -log V - (1/V)(3 log delta) grows without bound.
    delta = 1e-6
    one_hot = _logits_of([[[1 - 3 * delta, delta, delta, delta]]])
    assert token_entropy(one_hot).item() == pytest.approx(0.0, abs=1e-4)
    expected = -math.log(4) - (math.log(1 - 3 * delta) + 3 * math.log(delta)) / 4
    assert token_self_certainty(one_hot).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.verl
def test_logit_shift_invariance_and_verl_entropy():
    from verl.utils.torch_functional import entropy_from_logits

    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(token_entropy(logits + 7.0), token_entropy(logits))
    torch.testing.assert_close(token_self_certainty(logits - 3.0), token_self_certainty(logits), atol=1e-5, rtol=0)
    torch.testing.assert_close(token_entropy(logits), entropy_from_logits(logits))
    # Chunking changes nothing, and half-precision logits are reduced in float32.
    torch.testing.assert_close(token_entropy(logits, chunk_size=2), token_entropy(logits), rtol=0, atol=0)
    torch.testing.assert_close(token_self_certainty(logits, chunk_size=4), token_self_certainty(logits))
    assert token_entropy(logits.bfloat16()).dtype == torch.float32
    # KL(U || p) >= 0 and H <= log V.
    assert (token_self_certainty(logits) >= -1e-6).all()
    assert (token_entropy(logits) <= math.log(11) + 1e-6).all()


def test_rewards_average_over_response_tokens_only():
    # Row 0: tokens uniform, peaked, (padding: peaked); row 1: peaked then uniform then padding.
    uniform = [0.25] * 4
    peaked = [0.5, 0.25, 0.125, 0.125]
    logits = _logits_of([[uniform, peaked, peaked], [peaked, uniform, uniform]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    h_uniform, h_peaked = math.log(4), 1.75 * math.log(2)
    kl_peaked = 0.25 * math.log(2)
    assert self_certainty(logits, mask).tolist() == pytest.approx([kl_peaked / 2, kl_peaked / 2], rel=1e-6)
    entropy = token_entropy(logits)
    assert negative_entropy(entropy, mask).tolist() == pytest.approx([-(h_uniform + h_peaked) / 2] * 2, rel=1e-6)
    # Only the last response token of each row.
    assert negative_entropy(entropy, mask, last_tokens=1).tolist() == pytest.approx([-h_peaked, -h_uniform], rel=1e-6)
    # last_tokens longer than a response: the whole response.
    assert negative_entropy(entropy, mask, last_tokens=5).tolist() == pytest.approx(
        negative_entropy(entropy, mask).tolist()
    )


def test_last_tokens_on_left_padded_and_empty_rows():
    values = torch.tensor([[9.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 9.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]])
    assert masked_token_mean(values, mask, last_tokens=2).tolist() == [2.5, 2.5, 0.0]
    assert masked_token_mean(values, mask).tolist() == [2.0, 2.0, 0.0]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="last_tokens=0"):
        masked_token_mean(torch.zeros(1, 2), torch.ones(1, 2), last_tokens=0)
    with pytest.raises(ValueError, match=r"values \(1, 2\) and response_mask \(1, 3\)"):
        negative_entropy(torch.zeros(1, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="chunk_size=0"):
        token_entropy(torch.zeros(1, 2, 3), chunk_size=0)
