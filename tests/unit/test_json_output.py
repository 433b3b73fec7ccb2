"""`--json` documents: the text json.dumps(indent=2) writes, in pieces, never whole in memory."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest

from fstrain.cli.output import json_pieces, print_json


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


DOCUMENTS: list[Any] = [
    {}, [], "", "text", 0, -7, 10**30, 1.5, -0.0, 1e300, None, True, False,
    {"a": [], "b": {}, "c": [{}], "d": [[]]},
    {"é\n\"\\": ["tab\t", "\u2603", "\x00"], "nested": {"x": {"y": {"z": [1, 2.5, None, True]}}}},
    {7: "int key", 2.5: "float key", None: "none key", True: "bool key", Color.RED: Level.HIGH},
    (1, (2, ["a", 3])),
    [float("nan"), float("inf"), float("-inf")],
    {"nodes": [{"host": f"n{i}", "node_rank": i, "argv": ["python3", f"--node-rank={i}"], "env": {"A": "1"}}
               for i in range(700)]},
    {str(i): [i, str(i)] for i in range(600)},
    [[["x"] * 3] * 300] * 2,
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_pieces_are_what_json_dumps_writes(document: Any) -> None:
    assert "".join(json_pieces(document)) == json.dumps(document, indent=2)


def test_a_large_list_comes_an_item_at_a_time() -> None:
    document = {"run_id": "r", "nodes": [{"host": f"n{i}", "argv": ["a"] * 50} for i in range(5000)]}
    pieces = list(json_pieces(document))
    assert len(pieces) > 5000
    assert max(map(len, pieces)) < 1000  # a node at most, never the whole list


@pytest.mark.parametrize("document", [object(), {(1, 2): "tuple key"}, [{1, 2}]])
def test_what_json_cannot_write_is_refused_as_json_refuses_it(document: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(document, indent=2)
    with pytest.raises(TypeError):
        "".join(json_pieces(document))


def test_print_json_writes_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    print_json({"a": [1, 2]})
    assert capsys.readouterr().out == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'
