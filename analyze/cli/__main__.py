"""``python -m analyze.cli``: the ``analyze`` command."""

import sys

from analyze.cli import main

sys.exit(main())
