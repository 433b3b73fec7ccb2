"""Durations on the command line: ``20s``, ``5m``, ``1.5h``, ``7d``, or a number of seconds."""

from __future__ import annotations

import re

from fstrain.errors import InputError

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration_s(text: str, where: str) -> float:
    """Seconds in ``text``; a bare number is seconds."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise InputError(f"not a duration: {text!r}", "write a number with s, m, h or d, e.g. 20s, 5m, 7d", where)
    seconds = float(match.group(1)) * _UNITS_S[match.group(2) or "s"]
    if seconds <= 0:
        raise InputError(f"the duration must be above 0, got {text!r}", "e.g. 20s, 5m, 7d", where)
    return seconds
