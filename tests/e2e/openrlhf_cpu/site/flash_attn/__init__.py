"""Import-only stand-in for flash-attn (a CUDA build): OpenRLHF's ``models/ring_attn_utils.py:3-4``
imports these names at module top; the harness runs with ``--ds.attn_implementation sdpa`` and no
packing, so nothing here is called."""
