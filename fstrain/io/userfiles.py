"""Reading user files that may be hostile: bounded size, bounded YAML.

Every YAML document fstrain reads (recipes, plans, rendered ``fsdp.yaml``) goes through
:func:`load_yaml` (JSON ones, such as a Hugging Face ``config.json``, through :func:`load_json`),
and every small text file (hostfiles, env files, recipes) through
:func:`read_text_bounded`. The limits are far above any real file and far below what hurts:

- a file is read at most :data:`MAX_FILE_BYTES` (a bigger one is refused before it is parsed);
- YAML nesting deeper than :data:`MAX_YAML_DEPTH` is refused (PyYAML's composer recurses and
  would die with ``RecursionError``);
- a document whose aliases expand to more than :data:`MAX_YAML_NODES` nodes is refused. PyYAML
  shares aliased objects, so a "billion laughs" document loads small, then explodes in whatever
  walks it (validation, ``json.dumps``, ``yaml.safe_dump``). The expanded size is counted on the
  composed node graph, once per distinct node, so the check itself stays linear.

Each failure is one :class:`~fstrain.errors.InputError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fstrain.errors import InputError

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 200_000


def read_text_bounded(path: Path | str, what: str, *, limit_bytes: int = MAX_FILE_BYTES, hint: str = "") -> str:
    """The UTF-8 text of ``path`` (``what`` names it in errors: "hostfile", "env file" ...)."""
    where = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"{what} not found", hint or "check the path", where) from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory, not a file", hint or "give the path of a file", where) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what}: {exc.strerror or exc}", "check its permissions", where) from None
    if len(data) > limit_bytes:
        raise InputError(f"{what} is larger than {limit_bytes // (1024 * 1024)} MiB",
                         f"is this really the {what}?", where)
    if b"\0" in data:
        raise InputError(f"{what} contains NUL bytes (a binary file?)", f"give a text {what}", where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{what} is not UTF-8 text (byte {exc.start})", f"give a text {what}",
                         f"{where}:{line}") from None


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` with bounded depth and alias expansion; errors name ``where`` (and line)."""
    import yaml

    _check_flow_depth(text, where)
    loader = _BoundedLoader(text, where)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        location = f"{where}:{mark.line + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InputError(f"not valid YAML: {problem}", "fix the YAML syntax", location) from None
    except RecursionError:  # a guard against what the depth limit does not see (constructors)
        raise InputError("YAML nested too deeply", f"nest at most {MAX_YAML_DEPTH} levels", where) from None
    finally:
        loader.dispose()


def load_json(text: str, where: str) -> Any:
    """``json.loads`` with bounded nesting; errors name ``where`` and the line."""
    import json

    check_json_depth(text, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", "fix the JSON syntax", f"{where}:{exc.lineno}") from None


def check_json_depth(text: str, where: str) -> None:
    """Refuse JSON nested deeper than MAX_YAML_DEPTH (``json.loads`` recurses: RecursionError)."""
    _check_flow_depth(text, where, "JSON")


def _check_flow_depth(text: str, where: str, kind: str = "YAML") -> None:
    """Refuse deep ``[[[[`` / ``{{{{`` before PyYAML sees them: its scanner looks ahead over
    every open flow collection for a possible key, which is quadratic in the depth."""
    depth = 0
    for number, line in enumerate(text.splitlines(), start=1):
        for char in line:
            if char in "[{":
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise InputError(f"{kind} nested deeper than {MAX_YAML_DEPTH} levels",
                                     "flatten the document", f"{where}:{number}")
            elif char in "]}":
                depth = max(0, depth - 1)


def _loader_base() -> Any:
    import yaml

    return yaml.SafeLoader


class _BoundedLoader(_loader_base()):  # type: ignore[misc]
    """PyYAML's pure-Python SafeLoader with a depth count in the (recursive) composer."""

    def __init__(self, text: str, where: str) -> None:
        super().__init__(text)
        self._where = where
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise InputError(f"YAML nested deeper than {MAX_YAML_DEPTH} levels",
                             "flatten the document", f"{self._where}:{mark.line + 1}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_expanded_size(root: Any, where: str) -> None:
    """Refuse a node graph whose aliases expand to more than MAX_YAML_NODES nodes."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: meeting one again is a cycle
    # Iterative post-order walk: each distinct node is sized once (aliases reuse the size).
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        if not children_done:
            if any(id(child) in open_nodes or child is node for child in children):
                raise InputError("YAML refers to itself (a recursive alias)", "write the values out", where)
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_nodes.discard(id(node))
        sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
        if sizes[id(node)] > MAX_YAML_NODES:
            raise InputError(f"YAML expands to more than {MAX_YAML_NODES:,} values (an alias bomb?)",
                             "write the values out, or use fewer aliases", where)
