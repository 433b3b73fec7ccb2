"""Where output goes: humans read stderr (rich), machines read stdout (one JSON document)."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


@lru_cache(maxsize=1)
def console() -> Console:
    """The stderr console (rich is imported on first use, not at start-up)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(document: Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
