"""The framework-free core: collapse detection and ACR, AVSPO's settings, virtual samples, adaptive
controller and advantage, the Beta prior, DCPO's and the intrinsic rewards' math, the stall alert.

Every module here imports torch and numpy only, never verl, Ray, TransferQueue or OpenRLHF
(``tests/test_layout.py`` checks the imports), so the adapters of any framework can share it.
"""
