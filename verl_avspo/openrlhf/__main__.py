"""``python -m verl_avspo.openrlhf``: see :mod:`verl_avspo.openrlhf.launcher`."""

from verl_avspo.openrlhf.launcher import main

raise SystemExit(main())
