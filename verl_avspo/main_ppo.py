"""``python -m verl_avspo.main_ppo``: the launcher, at the name users type. It lives in
:mod:`verl_avspo.verl_plugin.launcher`; see that module for usage."""

import sys

from verl_avspo.verl_plugin.launcher import main

if __name__ == "__main__":
    sys.exit(main())
