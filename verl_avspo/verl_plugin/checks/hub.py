"""Model paths given as Hugging Face hub ids, decided in a second at most: in the local HF cache,
or on a hub that answers one request. Without this, a dry run spent about a minute in
huggingface_hub's retries on a machine without network before verl's own model config failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["HUB_TIMEOUT_S", "hub_model_problem", "hub_offline"]

HUB_TIMEOUT_S = 5.0


def hub_model_problem(key: str, repo_id: str) -> tuple[str | None, str]:
    """Whether ``repo_id`` (the value of ``key``) can be loaded: (a problem, or None; what a dry run
    could not check about it)."""
    import httpx
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
        return None, f"{key}={repo_id} (a Hugging Face hub id, found in the HF cache {constants.HF_HUB_CACHE})"
    local = f"set {key} to a local model directory"
    download = f"`hf download {repo_id} --local-dir DIR` where there is network, then {key}=DIR"
    if constants.HF_HUB_OFFLINE:
        return (
            f"{key}={repo_id} is a Hugging Face hub id that is not in the HF cache ({constants.HF_HUB_CACHE}), and "
            f"HF_HUB_OFFLINE is set, so it cannot be downloaded. Download it first ({download}), or {local}.",
            "",
        )
    try:
        huggingface_hub.model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return (
            None,
            f"{key}={repo_id} (a gated model on {constants.ENDPOINT}: log in with `hf auth login` once granted)",
        )
    except RepositoryNotFoundError:
        return (
            f"{key}={repo_id} is neither a local directory nor a model on {constants.ENDPOINT} (or it is private: "
            f"log in with `hf auth login`). Fix the name, or {local}.",
            "",
        )
    except (httpx.HTTPError, HfHubHTTPError, OSError) as err:
        return (
            f"{key}={repo_id} is neither a local directory nor in the HF cache, and {constants.ENDPOINT} does not "
            f"answer ({type(err).__name__}: {err}); the launch would retry for about a minute, then fail. Download "
            f"it ({download}), or {local}.",
            "",
        )
    return None, f"{key}={repo_id} (a Hugging Face hub id, found on {constants.ENDPOINT}: downloaded at launch)"


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """huggingface_hub (and transformers, which asks it) in offline mode: a model config is read from
    the cache or fails at once, without network retries. The hub ids themselves are checked by
    :func:`hub_model_problem`."""
    from huggingface_hub import constants

    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved
