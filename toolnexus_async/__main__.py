"""``python -m toolnexus_async`` is the ``toolnexus-async`` command."""

import sys

from ._cli import main

sys.exit(main())
