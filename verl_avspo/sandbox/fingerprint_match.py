"""Whether a printed ``verl-avspo sandbox --fingerprint`` line matches a machine docs/results.md quotes.

The hashes themselves are computed by :mod:`verl_avspo.sandbox.fingerprint`; this module holds what the docs
quote (:data:`DOCUMENTED_FINGERPRINT`, which tests/sandbox/test_end_to_end.py checks against the page) and
says, in one line, MATCH, PARTIAL MATCH (the documented samples, other weights), NO MATCH, or why there is
nothing to compare (other settings, other versions of torch or transformers).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["DOCUMENTED_FINGERPRINT", "DocumentedFingerprint", "fingerprint_verdict"]


class DocumentedFingerprint(NamedTuple):
    """A fingerprint docs/results.md quotes for the default settings, and the machines that printed it."""

    torch: str
    transformers: str
    samples: str
    weights: dict[str, str]  # weights hash -> the machine that printed it; the first measured the docs' table


# What docs/results.md quotes ("What `make demo` runs and prints"); tests/sandbox/test_end_to_end.py checks
# that the page quotes these values, so that the two change together.
DOCUMENTED_FINGERPRINT = DocumentedFingerprint(
    torch="2.13.0+cpu",
    transformers="5.10.4",
    samples="38c3bae65f5a",
    weights={"21d8ff69ba50": "the AMD EPYC (AVX-512) that measured docs/results.md's table"},
)


PRINTED = re.compile(r"weights (\w+), samples (\w+) \(torch (\S+), transformers (\S+)\)")


def fingerprint_verdict(line: str, defaults: bool) -> str:
    """Whether the printed fingerprint ``line`` matches a machine docs/results.md quotes
    (:data:`DOCUMENTED_FINGERPRINT`); ``defaults``: whether it was computed at the default settings, the
    only ones the docs quote."""
    documented = DOCUMENTED_FINGERPRINT
    weights, samples, torch_version, transformers_version = PRINTED.search(line).groups()
    if not defaults:
        return "no match to check: docs/results.md quotes the fingerprint of the default settings only"
    if (torch_version, transformers_version) != (documented.torch, documented.transformers):
        return (
            f"no match to check: docs/results.md quotes torch {documented.torch} and transformers "
            f"{documented.transformers}, and other versions compute other values"
        )
    if samples != documented.samples:
        return (
            f"NO MATCH: the samples differ from the documented {documented.samples}: this machine decides otherwise "
            "and `make demo` will print another table than docs/results.md"
        )
    reference, *others = documented.weights
    if weights == reference:
        return (
            f"MATCH: the same weights and samples as {documented.weights[reference]}: `make demo` should print that "
            "table"
        )
    whose = (
        f"the weights {documented.weights[weights]} printed"
        if weights in others
        else f"weights no documented machine printed ({', '.join(documented.weights)})"
    )
    return (
        f"PARTIAL MATCH: the documented samples, with {whose}, not those of {documented.weights[reference]}: this "
        "CPU rounds otherwise, its decisions agree so far, and `make demo`'s table may still differ"
    )
