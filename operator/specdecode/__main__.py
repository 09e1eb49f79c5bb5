"""`python -m specdecode` is the `specdecode` command (the local runner starts arms this way)."""

import sys

from specdecode.cli import main

sys.exit(main())
