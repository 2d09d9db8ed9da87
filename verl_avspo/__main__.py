"""``python -m verl_avspo``: the ``verl-avspo`` command (:mod:`verl_avspo.cli`)."""

import sys

from verl_avspo.cli import main

sys.exit(main())
