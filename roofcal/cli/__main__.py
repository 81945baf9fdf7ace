"""``python -m roofcal.cli``: the ``roofcal`` command."""

import sys

from roofcal.cli.main import batch_gc, main

batch_gc()
sys.exit(main())
