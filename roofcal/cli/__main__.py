"""``python -m roofcal.cli``: the ``roofcal`` command."""

import sys

from roofcal.cli.main import main

sys.exit(main())
