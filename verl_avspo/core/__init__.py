"""The framework-free core: collapse detection and ACR, the run's one step owner (``run_tracker``),
ACR's and AVSPO's settings and their validators, virtual samples, adaptive controller and advantage,
the Beta prior, DCPO's and the intrinsic rewards' math and settings, the stall alert.

Every module here imports torch and numpy only, never verl, Ray, TransferQueue or OpenRLHF
(``tests/test_layout.py`` checks the imports), so the adapters of any framework can share it.
"""
