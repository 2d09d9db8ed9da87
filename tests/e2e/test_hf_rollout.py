"""The CPU harness's ``hf`` rollout server, alone: the partial-rollout protocol verl's async trainers
drive (abort at the next chunk, park new requests until ``resume_generation``, turn them away with
``reject_request``), on the harness's tiny model, without Ray. The end-to-end runs rarely hit an
abort mid-request (a tiny model answers in well under a second), so the protocol is pinned here.
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
