"""``python -m specfold_compile.cli``: the ``specfold`` command."""

import sys

from .entry import main

sys.exit(main())
