"""The plugin's former path, kept for installs whose ``verl.plugins`` entry point and for users whose
``VERL_USE_EXTERNAL_MODULES`` still name ``verl_avspo.register``: it is the same module object as
:mod:`verl_avspo.verl_plugin.register` (not a copy), so registration runs once."""

import sys

from verl_avspo.verl_plugin import register

sys.modules[__name__] = register
