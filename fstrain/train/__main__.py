"""``python -m fstrain.train``: see :mod:`fstrain.train`."""

from fstrain.train.cli import main

main()
