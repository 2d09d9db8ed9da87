"""The verl adapter: the registered estimators and loss (``register``, verl's ``verl.plugins`` entry
point), the trainers (``trainer``), the launcher behind ``python -m verl_avspo.main_ppo``
(``launcher``), ``verl-avspo doctor`` (``doctor``) and the math-verify reward (``rewards``).

Importing this package imports nothing; ``register`` imports only ``verl.trainer.ppo.core_algos``.
"""
