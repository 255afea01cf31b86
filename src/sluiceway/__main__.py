"""`python -m sluiceway` runs the command line."""

import sys

from sluiceway.cli.main import main

sys.exit(main())
