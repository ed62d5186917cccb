"""``python -m research``: the studies' command line (from the repository root)."""

import sys

from research.cli import main

sys.exit(main())
