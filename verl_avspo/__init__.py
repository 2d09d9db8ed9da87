"""verl-avspo: Advantage Collapse Rate (ACR) diagnostics and the AVSPO advantage estimator.

One folder per layer (``docs/integration.md``, "Package layout"):

- ``core/``: the framework-free math (torch and numpy only);
- ``verl_plugin/``: verl's side (the registered estimators, the trainers, the launcher, doctor);
- ``openrlhf/``: OpenRLHF's side;
- ``sandbox/``: the CPU sandbox, a tiny policy trained with the core's estimators;
- ``tools/``: report, table, plots and demo over logs;
- ``cli.py``: the ``verl-avspo`` command (also ``python -m verl_avspo``).

``python -m verl_avspo.main_ppo`` keeps its short name (a module that leads to ``verl_plugin.launcher``).
Importing this package does not import verl.
"""

__version__ = "0.1.0"
