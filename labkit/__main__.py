"""``python -m labkit``: the ``labkit`` command, for an environment whose scripts are not on
PATH."""

import sys

from labkit.cli import main

sys.exit(main())
