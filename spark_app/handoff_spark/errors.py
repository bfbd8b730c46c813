"""Errors a person must act on (a setting, a credential, a decision about the ledger): the driver reports them
in one line naming what to fix, with exit code 2 and no traceback (`__main__.refuse`). Anything else is a bug or
an outage and keeps its traceback."""
from __future__ import annotations


class HandoffConfigError(RuntimeError):
    """A start the driver refuses until a person changes something; the message says what."""
