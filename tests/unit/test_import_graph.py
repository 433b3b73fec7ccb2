"""The import graph of fstrain/: no circles, no import back up the layers, and no CLI command
importing another command's module.

Every module is parsed with ``ast`` (nothing is imported): each ``import`` and ``from ... import``
statement counts, at module level, inside functions and under ``if TYPE_CHECKING``, with relative
imports resolved and ``from pkg import name`` read as the submodule ``pkg.name`` where there is one.
A circle hidden in a function-level import is still a circle: the two modules cannot be understood,
tested or moved apart.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fstrain"
# Shared by every command: output, option and error helpers, and the app that registers them all.
CLI_SHARED = {"fstrain.cli", "fstrain.cli.main", "fstrain.cli.output", "fstrain.cli.hostopts",
              "fstrain.cli.metavars", "fstrain.cli.usage_errors"}
# CLI modules that are clients of fstrain.api only: they import no fstrain.io module (core, for
# printing, and errors as well). The rest of fstrain/cli joins this list as it is moved behind the API.
def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imported(tree: ast.AST, name: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that module ``name``'s code imports, wherever the statement is."""
    known = set(known)

    def owner(dotted: str) -> str | None:  # the module a dotted name lives in: its longest known prefix
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {module for alias in node.names if (module := owner(alias.name))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one package up per extra dot
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            # `from pkg import sub` imports the submodule pkg.sub; `from pkg import NAME`, pkg itself
            found |= {module for alias in node.names if (module := owner(f"{base}.{alias.name}"))}
    found.discard(name)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = modules_of(root)
    return {name: imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", modules)
            for name, path in modules.items()}


def knots(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each set of two or more modules that import each other, directly or not (Tarjan's strongly
    connected components, iteratively: a deep import chain must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in graph:
                    continue
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle (``[a, b, ..., a]``) in each knot."""
    return [circle_in(graph, set(knot)) for knot in knots(graph)]


def circle_in(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """A shortest circle through the first module of a strongly connected ``component``."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & component):
                if successor == start:
                    return [*paths[node], start]
                if successor not in paths:
                    paths[successor] = [*paths[node], successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(component)}")


def outside_cli(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    def cli(name: str) -> bool:
        return name == "fstrain.cli" or name.startswith("fstrain.cli.")
    return {name: {target for target in targets if not cli(target)} for name, targets in graph.items() if not cli(name)}


def command_modules(main: Path = PACKAGE / "cli" / "main.py") -> set[str]:
    """The modules that register commands: the values of ``COMMAND_MODULES`` in fstrain/cli/main.py."""
    for node in ast.parse(main.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMMAND_MODULES"
                                                for t in node.targets):
            return {f"fstrain.cli.{module}" for module in ast.literal_eval(node.value).values()}
    raise AssertionError(f"{main}: no COMMAND_MODULES")


def cross_command_imports(graph: Mapping[str, set[str]], commands: set[str]) -> list[str]:
    """``a imports b`` for each CLI module that imports a command module other than its own (a
    command's helper module, ``plan_output``, belongs to ``plan``)."""
    def command_of(name: str) -> str:
        return next((command for command in commands if name == command or name.startswith(command + "_")), name)
    return [f"{name} imports {target}" for name in sorted(graph)
            if name.startswith("fstrain.cli.") and name not in CLI_SHARED
            for target in sorted(graph[name]) if target in commands and target != command_of(name)]


def describe(graph: Mapping[str, set[str]]) -> str:
    """Each knot as one of its circles and every module in it."""
    return "\n".join(f"{' -> '.join(circle_in(graph, set(knot)))}   (the knot: {', '.join(knot)})"
                     for knot in knots(graph))


# What each layer may import (docs/architecture.md): cli -> api -> io -> core -> errors, and the
# bundled programs (train, bench) on core. The CLI is a client of the API only. `fstrain` alone is
# the package (its __version__).
MAY_IMPORT = {
    "errors": set(),
    "cli": {"cli", "api", "core", "errors", "fstrain"},  # a client of the API; pure core for printing
    "api": {"api", "io", "core", "errors", "fstrain", "train"},  # train: the plan's trace, imported when asked
    "core": {"core", "errors"},
    "io": {"io", "core", "errors", "fstrain"},
    "train": {"train", "io", "core", "errors", "fstrain"},  # io/userfiles.py: the trainer reads files as the CLI does
    "bench": {"bench", "core", "errors"},
}


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """``a imports b`` for each import that runs against the layers (``__main__`` may import all)."""
    return [f"{name} imports {target}" for name in sorted(graph) if layer(name) in MAY_IMPORT
            for target in sorted(graph[name]) if layer(target) not in MAY_IMPORT[layer(name)]]


# The first-level parts of fstrain/core (its packages and its modules outside a package), lowest
# first (docs/architecture.md): a part imports only parts before it. A new part must be placed here.
CORE_ORDER = (
    "formats",  # document format versions
    "hosts",  # hostfiles, host lists, known_hosts
    "topo",  # the Node model; NCCL topology XML read and written
    "parsers",  # tool output and the probe report -> values (on topo)
    "topofile",  # the NCCL topology XML generated for a node (on parsers and topo)
    "plan",  # the planner and plan.yaml
    "render",  # a plan -> the files a training job reads
    "job",  # what `launch` runs where (on plan and hosts)
    "runs",  # a run's records and state
    "monitor",  # watching a running job (on runs)
    "launch",  # supervision (on monitor)
    "progress",  # progress of long work (on monitor's metric line)
    "report",  # `fstrain report` (on runs and monitor)
    "slurm",  # Slurm allocations and a job's state (on runs)
    "doctor",  # doctor's checks (on job, plan, parsers, topo)
    "bench",  # bench arithmetic and reports (on doctor's results and plan)
    "calibrate",  # `plan --calibrate` (on bench, report, runs and plan)
    "track",  # what a launch sends its experiment trackers (on monitor and report)
)


def core_part(module: str) -> str | None:
    """The first-level part of fstrain.core a module belongs to (None outside core, and for the
    package fstrain.core itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["fstrain", "core"] else None


def core_imports_against_the_order(graph: Mapping[str, set[str]], order: Iterable[str]) -> list[str]:
    """``a imports b`` for each import between two first-level parts of fstrain.core that does not
    go from a higher part to a lower one in ``order`` (a part missing from it is never lower)."""
    rank = {part: index for index, part in enumerate(order)}

    def goes_down(source: str, target: str) -> bool:
        return source in rank and target in rank and rank[source] > rank[target]

    return [f"{name} imports {target}" for name in sorted(graph) if (source := core_part(name))
            for target in sorted(graph[name]) if (part := core_part(target)) and part != source
            and not goes_down(source, part)]


def test_the_graph_reads_every_module() -> None:
    graph = import_graph()
    assert {"fstrain.errors", "fstrain.core", "fstrain.io.launch", "fstrain.cli.main"} <= set(graph)
    assert len(graph) > 100
    assert "fstrain.errors" in graph["fstrain.io.launch"]


def test_core_io_api_train_and_bench_import_no_circle() -> None:
    graph = outside_cli(import_graph())
    assert cycles(graph) == [], "import circles:\n" + describe(graph)


def test_no_import_runs_back_up_the_layers() -> None:
    graph = import_graph()
    assert {layer(name) for name in graph} - set(MAY_IMPORT) == {"fstrain", "__main__"}
    assert upward_imports(graph) == []


def test_core_order_places_every_part_of_core_once() -> None:
    parts = {part for name in import_graph() if (part := core_part(name))}
    assert len(set(CORE_ORDER)) == len(CORE_ORDER), "a part is placed twice in CORE_ORDER"
    assert sorted(parts - set(CORE_ORDER)) == [], "first-level parts of fstrain/core missing from CORE_ORDER"
    assert sorted(set(CORE_ORDER) - parts) == [], "CORE_ORDER names parts fstrain/core no longer has"


def test_core_parts_import_only_lower_parts() -> None:
    found = core_imports_against_the_order(import_graph(), CORE_ORDER)
    assert found == [], "imports against CORE_ORDER (lowest first):\n" + "\n".join(found)


def test_no_circle_anywhere_cli_included() -> None:
    graph = import_graph()
    assert cycles(graph) == [], "import circles:\n" + describe(graph)


def test_no_cli_module_imports_another_commands_module() -> None:
    found = cross_command_imports(import_graph(), command_modules())
    assert found == [], "\n".join(found)


# -- the checks themselves, on small packages written here -----------------------------------------


def write_package(root: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_imports_are_resolved_wherever_they_are(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "pkg/__init__.py": "from pkg.sub import helper\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/helper.py": "from . import sibling\nfrom .. import top\n",
        "pkg/sub/sibling.py": "def late():\n    from ..top import VALUE\n    import pkg.sub.helper\n",
        "pkg/top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import NAME\n"
                      "import os\nfrom pkg.sub.sibling import late as _late\n",
    })
    assert import_graph(package) == {
        "pkg": {"pkg.sub.helper"},
        "pkg.sub": set(),
        "pkg.sub.helper": {"pkg.sub.sibling", "pkg.top"},
        "pkg.sub.sibling": {"pkg.top", "pkg.sub.helper"},
        "pkg.top": {"pkg.sub", "pkg.sub.sibling"},
    }


def test_a_circle_is_found_and_printed(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from pkg.c import g\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "import pkg.a\n",
    })
    graph = import_graph(package)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe(graph) == "pkg.a -> pkg.b -> pkg.c -> pkg.a   (the knot: pkg.a, pkg.b, pkg.c)"
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_upward_imports_are_named() -> None:
    graph = {"fstrain.core.plan.memory": {"fstrain.errors", "fstrain.io.launch"},
             "fstrain.io.launch": {"fstrain", "fstrain.cli.output", "fstrain.core.plan.memory"},
             "fstrain.train.model": {"fstrain.io.userfiles"}, "fstrain.bench.worker": {"fstrain.train.model"},
             "fstrain.cli.launch": {"fstrain.io.launch", "fstrain.train.model", "fstrain.api.launch"}}
    assert upward_imports(graph) == ["fstrain.bench.worker imports fstrain.train.model",
                                     "fstrain.cli.launch imports fstrain.io.launch",  # the CLI: the API only
                                     "fstrain.cli.launch imports fstrain.train.model",
                                     "fstrain.core.plan.memory imports fstrain.io.launch",
                                     "fstrain.io.launch imports fstrain.cli.output"]


def test_imports_against_the_core_order_are_named() -> None:
    graph = {"fstrain.core": set(),
             "fstrain.core.plan.memory": {"fstrain.core.plan.gpus", "fstrain.core.formats", "fstrain.errors"},
             "fstrain.core.plan.gpus": {"fstrain.core.launch.spec"},
             "fstrain.core.launch.spec": {"fstrain.core.plan.memory", "fstrain.core.new.thing"},
             "fstrain.core.formats": {"fstrain.core"},
             "fstrain.core.new.thing": {"fstrain.core.formats"},
             "fstrain.io.launch": {"fstrain.core.launch.spec", "fstrain.core.formats"}}
    assert core_part("fstrain.core.plan.memory") == "plan" and core_part("fstrain.core.formats") == "formats"
    assert core_part("fstrain.core") is None and core_part("fstrain.io.launch") is None
    assert core_imports_against_the_order(graph, ["formats", "plan", "launch"]) == [
        "fstrain.core.launch.spec imports fstrain.core.new.thing",  # not placed: never lower
        "fstrain.core.new.thing imports fstrain.core.formats",  # not placed: never higher
        "fstrain.core.plan.gpus imports fstrain.core.launch.spec"]
    assert core_imports_against_the_order(graph, ["formats", "new", "launch", "plan"]) == [
        "fstrain.core.launch.spec imports fstrain.core.plan.memory"]


def test_cli_cross_imports_are_named() -> None:
    graph = {"fstrain.cli.plan": {"fstrain.cli.plan_output", "fstrain.cli.output"},
             "fstrain.cli.plan_output": {"fstrain.cli.plan"},
             "fstrain.cli.render": {"fstrain.cli.plan", "fstrain.cli.main"},
             "fstrain.cli.main": {"fstrain.cli.render"}}
    commands = {"fstrain.cli.plan", "fstrain.cli.render"}
    assert cross_command_imports(graph, commands) == ["fstrain.cli.render imports fstrain.cli.plan"]
    assert "fstrain.cli.runs" in command_modules()
