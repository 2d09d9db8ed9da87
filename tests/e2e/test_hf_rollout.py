"""The CPU harness's ``hf`` rollout server, alone, on the harness's tiny model, without Ray:

- the partial-rollout protocol verl's async trainers drive (abort at the next chunk, park new requests
  until ``resume_generation``, turn them away with ``reject_request``). The end-to-end runs rarely hit
  an abort mid-request (a tiny model answers in well under a second), so the protocol is pinned here;
- the seeding the e2e's resume comparisons rest on: each group (``det-<position>`` request id) gets the
  same responses whatever order its requests and another group's of the same prompt arrive in.
"""

import asyncio

import pytest
from omegaconf import OmegaConf
from verl_cpu import assets
from verl_cpu.hf_rollout import CHUNK_TOKENS, HFGenerateServer

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model, tokenizer = assets.build_model(tmp_path_factory.mktemp("hf"))
    config = OmegaConf.create({"prompt_length": 16, "response_length": 3 * CHUNK_TOKENS})
    model_config = {"path": str(model), "tokenizer_path": str(tokenizer)}
    return HFGenerateServer(config, model_config, replica_rank=0)


PROMPT = [3, 4, 5]
# eos never sampled: every request runs its whole budget, so an abort always finds it running.
SAMPLING = {"temperature": 1.0, "max_tokens": 3 * CHUNK_TOKENS, "logprobs": True}


def no_eos(server):
    server.eos_token_ids = {-1}


def test_an_abort_stops_a_running_request_at_its_next_chunk_and_parks_new_ones(server):
    no_eos(server)

    async def scenario():
        running = asyncio.create_task(server.generate("r1", PROMPT, dict(SAMPLING)))
        await asyncio.sleep(0)  # the request generates its first chunk, then yields
        await server.abort_all_requests()
        partial = await running
        assert partial.stop_reason == "aborted" and len(partial.token_ids) == CHUNK_TOKENS
        assert len(partial.log_probs) == CHUNK_TOKENS
        # verl's client resumes it with the tokens so far; the server holds it until resume_generation.
        resumed = asyncio.create_task(
            server.generate("r1", PROMPT + partial.token_ids, {**SAMPLING, "max_tokens": 2 * CHUNK_TOKENS})
        )
        await asyncio.sleep(0.05)
        assert not resumed.done()
        await server.resume_generation()
        rest = await resumed
        assert rest.stop_reason == "length" and len(rest.token_ids) == 2 * CHUNK_TOKENS
        # reject_request turns new requests away at once (verl's client retries on another server).
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate("r2", PROMPT, dict(SAMPLING))
        assert rejected.stop_reason == "aborted" and rejected.token_ids == []
        await server.resume_generation()
        whole = await server.generate("r3", PROMPT, dict(SAMPLING))
        assert whole.stop_reason == "length" and len(whole.token_ids) == 3 * CHUNK_TOKENS

    asyncio.run(scenario())


def test_two_groups_of_one_prompt_sample_alike_whatever_order_their_requests_arrive_in(server):
    """The e2e's resume comparisons rest on this: a batch that holds one prompt twice (two groups)."""
    server.eos_token_ids = {-1}
    server.weights_version = 7

    async def responses(order: list[str]) -> dict[str, list[tuple[int, ...]]]:
        server._draws.clear()  # as load_weights does: a new weights version draws afresh
        outputs = await asyncio.gather(*(server.generate(group, PROMPT, dict(SAMPLING)) for group in order))
        by_group: dict[str, list[tuple[int, ...]]] = {}
        for group, output in zip(order, outputs, strict=True):
            by_group.setdefault(group, []).append(tuple(output.token_ids))
        return {group: sorted(answers) for group, answers in by_group.items()}

    grouped = asyncio.run(responses(["det-0"] * 3 + ["det-1"] * 3))
    interleaved = asyncio.run(responses(["det-1", "det-0"] * 3))
    assert grouped == interleaved
    assert grouped["det-0"] != grouped["det-1"]  # the groups draw apart, not one counter shared
    # Within a group the draw count tells identical requests apart; so it does for verl's fresh uuids
    # (no full_determinism), which stay out of the seed.
    assert len(set(grouped["det-0"])) == 3
    plain = asyncio.run(responses(["9f1c", "03ab", "77de"]))
    assert len({answer for answers in plain.values() for answer in answers}) == 3
