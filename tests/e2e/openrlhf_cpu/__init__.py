"""A test-only harness that runs OpenRLHF 0.11.2's own Ray PPO trainer on CPU (not shipped).

``launch.py`` builds a tiny random Qwen2 and a prompt file and runs ``python -m
openrlhf.cli.train_ppo_ray`` (unmodified) or ``python -m verl_avspo.openrlhf`` as a subprocess under a
hard timeout. ``site/`` is put on the run's ``PYTHONPATH`` and reaches every Ray worker: stand-ins for
the packages a CPU machine cannot install (``vllm``: generation with Hugging Face ``generate`` and a
gloo weight sync; ``flash_attn``: import only) and ``sitecustomize.py``, the post-import CPU patches,
each naming the OpenRLHF or DeepSpeed line it replaces. ``reward.py`` is the ``--reward.remote_url``.
"""
