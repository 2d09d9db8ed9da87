"""verl-avspo: Advantage Collapse Rate (ACR) diagnostics and the AVSPO advantage estimator.

The core (``collapse``, ``virtual``, ``controller``, ``advantage``, ``config``) is framework-free
torch. ``verl_avspo.register`` plugs it into verl; importing this package does not import verl.
"""

__version__ = "0.1.0"
