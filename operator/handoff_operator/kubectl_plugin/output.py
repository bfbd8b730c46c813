"""`-o text|json|yaml` for the commands that print a document: `kubectl handoff status|ledger|timeline|replay` and
the local `handoff timeline`, so both print one document the same way (pure formatting, one print)."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from handoff_operator import yaml_text


def print_document(doc: Any, output: str, text: Callable[[Any], str]) -> None:
    """`doc` as JSON, YAML, or the command's own text (`text`)."""
    if output == "json":
        print(json.dumps(doc, indent=2, default=str))
    elif output == "yaml":
        print(yaml_text.dump(doc, sort_keys=False, default_flow_style=False), end="")
    else:
        print(text(doc))
