"""``python -m instrument.cli``: the ``instrument`` command."""

import sys

from instrument.cli import main

sys.exit(main())
