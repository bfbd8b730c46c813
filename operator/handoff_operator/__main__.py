"""`python -m handoff_operator operator` (same as the `handoff` console script)."""
import sys

from .cli import main

sys.exit(main())
