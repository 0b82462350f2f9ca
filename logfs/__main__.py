"""``python -m logfs``: the ``logfs`` command (handy under cProfile or py-spy)."""

import sys

from logfs.cli import main

sys.exit(main())
