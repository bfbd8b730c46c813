"""`python -m handoff_operator operator` (same as the `handoff` console script)."""
import sys

from handoff_operator.cli import main

sys.exit(main())
