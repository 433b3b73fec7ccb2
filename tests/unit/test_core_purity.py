"""fstrain/core stays pure: no network, processes, GPUs, frameworks or terminal UI (AST imports)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "fstrain" / "core"
# Sent to the nodes as source text with the scripts of fstrain/io/remote (fstrain/io/runs.py reads
# them by path, fstrain/io/logs.py through logtail.__file__): they run alone there, beside no fstrain.
NODE_SIDE = ("monitor/rankexit.py", "monitor/stacks.py", "launch/supervisor.py", "monitor/logtail.py",
             "monitor/metricline.py", "monitor/promfile.py")
FORBIDDEN = {"paramiko", "subprocess", "socket", "torch", "deepspeed", "rich", "typer", "pynvml", "multiprocessing",
             "asyncio", "threading", "shutil", "requests", "urllib", "http", "ctypes", "signal", "pty", "select"}
FORBIDDEN_CALLS = {("os", "system"), ("os", "popen"), ("os", "spawnv"), ("os", "execv"), ("os", "fork"),
                   ("os", "kill")}


def imported_modules(tree: ast.AST) -> set[str]:
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return names


def test_core_has_modules() -> None:
    assert len(list(CORE.rglob("*.py"))) >= 5


def test_core_imports_nothing_impure() -> None:
    problems = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for module in imported_modules(tree):
            top = module.split(".")[0]
            if top in FORBIDDEN or (top == "fstrain" and not module.startswith(("fstrain.core", "fstrain.errors"))):
                problems.append(f"{path.relative_to(CORE.parent.parent)}: imports {module}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and (node.value.id, node.attr) in FORBIDDEN_CALLS):
                where = f"{path.relative_to(CORE.parent.parent)}:{node.lineno}"
                problems.append(f"{where}: {node.value.id}.{node.attr}")
    assert problems == []


def test_node_side_modules_import_only_the_standard_library() -> None:
    outside = {}
    for relative in NODE_SIDE:
        tree = ast.parse((CORE / relative).read_text(), relative)
        outside[relative] = sorted({name.split(".")[0] for name in imported_modules(tree)}
                                   - set(sys.stdlib_module_names))
    assert outside == {relative: [] for relative in NODE_SIDE}


def test_the_edge_sends_only_node_side_modules_by_path() -> None:
    """Every ``name.py`` the edge reads to send is a node-side module of fstrain/core (or a
    script beside the edge's own modules): a moved file fails here, not on a cluster."""
    io = CORE.parent / "io"
    node_side = {Path(relative).name for relative in NODE_SIDE}
    sent = {node.value for path in io.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py")}
    assert sent, "no module sent by path: the check looks at nothing"
    assert sorted(name for name in sent if not (io / name).exists()) == sorted(sent & node_side)
    assert all((CORE / relative).is_file() for relative in NODE_SIDE)


def test_the_check_catches_a_forbidden_import() -> None:
    tree = ast.parse("import subprocess\nfrom rich.console import Console\nfrom fstrain.io import probe\n")
    assert imported_modules(tree) == {"subprocess", "rich.console", "fstrain.io"}
