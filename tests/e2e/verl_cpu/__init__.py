"""A test harness that runs verl 0.9.1's own PPO trainer on CPU, from outside verl.

:mod:`verl_cpu.plugin` is the module to name in ``VERL_USE_EXTERNAL_MODULES`` (with this folder's
parent on ``PYTHONPATH``): it registers a ``cpu`` platform, verl's FSDP engines for it, gloo
training workers and an ``hf`` rollout backend. :mod:`verl_cpu.assets` builds a tiny model, its
tokenizer and an arithmetic dataset; :mod:`verl_cpu.launch` composes a run. Nothing here is shipped
with verl-avspo.
"""
