"""``python -m timebound`` is the same as the ``timebound`` command."""

import sys

from .cli import main

sys.exit(main())
