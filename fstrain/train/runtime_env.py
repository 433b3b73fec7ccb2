"""Launcher-provided facts that do not need torch."""

from __future__ import annotations

import os


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))
