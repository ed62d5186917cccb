"""``python -m tokmem.cli``: the command line, for launchers that start a module (``torchrun -m tokmem.cli``)."""

import sys

from tokmem.cli import main

sys.exit(main())
