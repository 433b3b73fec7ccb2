"""Reading a run record's fields from its JSON document (fstrain/core/runs/runrecord.py,
manifest.py): a field of the wrong kind is an InputError naming the field and the file, in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fstrain.errors import InputError

HINT = "the file was changed by hand or cut short: start the run again, or remove it"


def text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"{key} must be non-empty text, got {value!r}", HINT, where)
    return value


def optional_text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return str(value) if value else None


def integer(data: Mapping[str, Any], key: str, where: str) -> int:
    value = optional_integer(data, key, where)
    if value is None:
        raise InputError(f"{key} is missing", HINT, where)
    return value


def optional_integer(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InputError(f"{key} must be an integer, got {value!r}", HINT, where)
    return value


def number(data: Mapping[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{key} must be a number, got {value!r}", HINT, where)
    return float(value)


def mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise InputError(f"{key} must be an object, got {value!r}", HINT, where)
    return value


def strings(data: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    """An object of text values (an environment): every key and value as text."""
    return {str(k): str(v) for k, v in (mapping(data, key, where) or {}).items()}


def items(data: Mapping[str, Any], key: str, where: str) -> Sequence[Any]:
    """A list (empty where the key is missing)."""
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InputError(f"{key} must be a list, got {value!r}", HINT, where)
    return value


def objects(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    """A list of objects (empty where the key is missing)."""
    values = items(data, key, where)
    if not all(isinstance(v, Mapping) for v in values):
        raise InputError(f"{key} must be a list of objects", HINT, where)
    return list(values)
