"""The TRL harness: the tiny GRPO runs of the TRL tests and of ``run_cpu_trl.py`` on TRL's real
``GRPOTrainer`` (``harness``), and one process of a launched run (``train.py``)."""
