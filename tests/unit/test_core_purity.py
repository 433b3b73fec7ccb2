"""fstrain/core stays pure: no network, processes, GPUs, frameworks or terminal UI (AST imports)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "fstrain" / "core"
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


def test_the_check_catches_a_forbidden_import() -> None:
    tree = ast.parse("import subprocess\nfrom rich.console import Console\nfrom fstrain.io import probe\n")
    assert imported_modules(tree) == {"subprocess", "rich.console", "fstrain.io"}
