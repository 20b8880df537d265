"""`python -m queasy_py.cli` is the `queasy` command."""

import sys

from .main import main

sys.exit(main())
