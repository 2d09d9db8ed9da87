"""One floating-point code path for the sandbox on every x86-64 CPU with AVX2.

torch's CPU wheel picks its kernels when it runs, from the CPU's instruction sets: ATen's
vectorized kernels (AVX-512, AVX2 or plain C++), MKL's matrix products and math functions (``exp``,
``log``, ``logsumexp``) and oneDNN's. Each path rounds differently (a sum over 16 lanes is not a sum
over 8), and the sandbox amplifies the last bit: the 1000-step warm-up and every sampled token turn
it into another policy. Before this module, the same ``make demo`` printed GRPO at 57.9% on an
AVX-512 Xeon and 31.5% on an AVX2 EPYC.

The sandbox therefore runs ATen and MKL on one code path each (``PINNED_KERNELS``): ATen's AVX2
kernels, which every x86-64 CPU with AVX2 runs the same way (Intel's since 2013, AMD's since 2015),
and MKL's ``COMPATIBLE`` reproducibility branch, the only one that MKL documents as the same on
Intel's and AMD's CPUs. On the development machine ``make demo`` takes 1.4 times the CPU time, the
warm-up 1.7 times; ATen's plain C++ kernels, which would cover CPUs without AVX2 too, cost another
20%. Each library reads its setting once, when torch loads or first calls it, so the ``verl-avspo
sandbox`` command sets them before it imports torch. Called from Python after torch was imported,
the sandbox cannot, and says so (:func:`describe`).

The pins did not make a Zen 4 EPYC print the Xeon's table. What differed was not found on the
Xeon; the sandbox now leaves less to the libraries: tokens are drawn from float64 probabilities
with a per-run generator instead of ``torch.multinomial`` (:func:`verl_avspo.sandbox.policy.next_tokens`),
and log-probabilities come from ATen's ``log_softmax``, not from MKL's ``exp`` and ``log``
(:func:`verl_avspo.sandbox.policy.token_log_probs`), so that MKL computes the matrix products, one
``exp`` in verl's PPO loss and the logged entropy's ``logsumexp`` only. The command runs on ``--threads`` threads (1
by default; a tiny run printed the same numbers with 2). Other architectures (ARM CPUs run other
libraries) compute other numbers. ``verl-avspo sandbox --fingerprint`` tells in seconds whether a
machine computes as the one that measured the docs' table (:mod:`verl_avspo.sandbox.fingerprint`).
"""

from __future__ import annotations

import os
import sys

__all__ = ["PINNED_KERNELS", "pin_kernels", "pinned", "describe"]

PINNED_KERNELS = {
    # ATen's vectorized kernels for AVX2, whatever wider ones the CPU has.
    "ATEN_CPU_CAPABILITY": "avx2",
    # MKL's conditional numerical reproducibility, COMPATIBLE branch (SSE2 without the approximate
    # rcpps/rsqrtps instructions): the same results on every Intel and AMD CPU; it overrides
    # MKL_ENABLE_INSTRUCTIONS. MKL's other branches hold only on Intel's CPUs.
    "MKL_CBWR": "COMPATIBLE",
    # oneDNN (torch.backends.mkldnn) capped at AVX2, for any operation that reaches it.
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
_PINNED_CAPABILITY = "AVX2"  # torch.backends.cpu.get_cpu_capability() on the pinned path


def pin_kernels() -> None:
    """Set ``PINNED_KERNELS`` in this process's environment, overriding the user's values, if torch
    is not imported yet; otherwise leave the environment alone (it would reach only child processes)."""
    if "torch" not in sys.modules:
        os.environ.update(PINNED_KERNELS)


def pinned() -> bool:
    """Whether this process runs on the pinned path: ATen's capability as torch resolved it (lower on
    a CPU without AVX2), and the environment that MKL and oneDNN read."""
    import torch

    return torch.backends.cpu.get_cpu_capability() == _PINNED_CAPABILITY and all(
        os.environ.get(name) == value for name, value in PINNED_KERNELS.items() if name != "ATEN_CPU_CAPABILITY"
    )


def describe() -> str:
    """One sentence for ``summary.md``: which kernels computed the numbers."""
    import torch

    if pinned():
        return (
            "Kernels: ATen's AVX2 kernels and MKL's `COMPATIBLE` branch, one code path on any x86-64 CPU with AVX2 "
            "(`verl-avspo sandbox --fingerprint` checks this machine against docs/results.md in seconds)."
        )
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get("ATEN_CPU_CAPABILITY") == PINNED_KERNELS["ATEN_CPU_CAPABILITY"]:
        why = f"this CPU has no AVX2 (ATen runs `{capability}`)"
    else:
        why = (
            f"torch was imported before the sandbox could pin its kernels (ATen runs `{capability}`); the "
            "`verl-avspo sandbox` command pins them"
        )
    return f"Kernels: {why}. The numbers depend on this CPU."
