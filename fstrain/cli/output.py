"""Where output goes: humans read stderr (rich), machines read stdout (one JSON document)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
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


def say(line: str) -> None:
    """A line the API says once (how hosts are reached, a run's id), dim on stderr: the ``report``
    the commands pass to ``fstrain.api``."""
    from rich.markup import escape

    console().print(f"[dim]{escape(line)}[/dim]", highlight=False, soft_wrap=True)


def print_json(document: Any) -> None:
    """Exactly one JSON document on stdout (as ``json.dumps(document, indent=2)`` writes it)."""
    for piece in json_pieces(document):
        sys.stdout.write(piece)
    sys.stdout.write("\n")
    sys.stdout.flush()


# The document's top two levels, and any container with more items than this, are written item
# by item, so a document of 100,000 nodes is never held as one string (nor as json's millions of
# small chunks) before it is written.
_STREAMED_LEVELS = 2
_STREAMED_ITEMS = 256
_quote = json.encoder.encode_basestring_ascii  # json's own C escaper (ensure_ascii=True)


def json_pieces(value: Any, level: int = 0) -> Iterator[str]:
    """``json.dumps(value, indent=2)``, the same text, in pieces of about one item of a large
    container. json's indented encoder is pure Python, a generator call per value: on a
    100,000-node dry run it took longer than everything else together. Lists of strings (a
    node's argv) and dicts of strings (its environment) are joined in one step here."""
    if _streamed(value, level):
        inner = "\n" + "  " * (level + 1)
        is_dict = isinstance(value, dict)
        items = value.items() if is_dict else value
        yield "{" if is_dict else "["
        for number, item in enumerate(items):
            head = ("," if number else "") + inner
            if is_dict:
                key, item = item
                head += _key(key) + ": "
            if _streamed(item, level + 1):
                yield head
                yield from json_pieces(item, level + 1)
            else:
                yield head + _encode(item, level + 1)
        yield "\n" + "  " * level + ("}" if is_dict else "]")
    else:
        yield _encode(value, level)


def _streamed(value: Any, level: int) -> bool:
    return isinstance(value, (list, tuple, dict)) and bool(value) and (
        level < _STREAMED_LEVELS or len(value) > _STREAMED_ITEMS)


def _encode(value: Any, level: int) -> str:
    kind = type(value)
    if kind is str:
        return _quote(value)
    if kind is dict or (kind is not list and kind is not tuple and isinstance(value, dict)):
        if not value:
            return "{}"
        inner = "\n" + "  " * (level + 1)
        body = ("," + inner).join([(_quote(key) if type(key) is str else _key(key)) + ": "
                                   + (_quote(item) if type(item) is str else
                                      int.__repr__(item) if type(item) is int else _encode(item, level + 1))
                                   for key, item in value.items()])
        return "{" + inner + body + "\n" + "  " * level + "}"
    if kind is list or kind is tuple or isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        inner = "\n" + "  " * (level + 1)
        try:  # all strings (an argv): json's escaper refuses anything else
            body = ("," + inner).join(map(_quote, value))
        except TypeError:
            body = ("," + inner).join([_encode(item, level + 1) for item in value])
        return "[" + inner + body + "\n" + "  " * level + "]"
    if isinstance(value, str):
        return _quote(value)
    return _scalar(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return _quote(key)
    if key is None or isinstance(key, (bool, int, float)):
        return _quote(_scalar(key))  # json writes a non-string key as the string of its value
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
