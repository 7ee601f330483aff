"""``python -m fedx.deploy``: see :mod:`fedx.deploy.cli`."""

import sys

from fedx.deploy.cli import main

sys.exit(main())
