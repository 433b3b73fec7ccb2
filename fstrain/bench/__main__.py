"""``python -m fstrain.bench``: see :mod:`fstrain.bench.worker`."""

import sys

from fstrain.bench.worker import main

sys.exit(main())
