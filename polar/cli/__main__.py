"""``python -m polar.cli``: the ``polar`` command (how tests and the gateway's ``--workers`` start it)."""

import sys

from polar.cli.entry import main

sys.exit(main())
