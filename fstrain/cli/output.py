"""Where output goes: humans read stderr (rich), machines read stdout (one JSON document)."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


# Width of stderr when it is not a terminal (CI logs, `2> file`) and COLUMNS is unset: rich
# would wrap every table at 80 columns; a log has no edge, so rows stay whole up to this width.
UNWRAPPED_WIDTH = 400


@lru_cache(maxsize=1)
def console() -> Console:
    """The stderr console (rich is imported on first use, not at start-up)."""
    import os

    from rich.console import Console

    width = None
    if not sys.stderr.isatty() and not os.environ.get("COLUMNS"):
        width = UNWRAPPED_WIDTH
    return Console(stderr=True, highlight=False, width=width)


def print_json(document: Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
