"""No module of the package imports itself back through a chain of imports: the graph of every import statement of
every module (function-level imports included, parsed as :mod:`tests.test_layers` parses them) has no cycle.

A lazy import inside a function hides a cycle at import time but not from a reader; it is still a cycle here. An
import under ``if TYPE_CHECKING:`` never runs (annotations only) and is no edge of the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import MODULES, SRC, imports, module_name


def type_checking_lines(code: str) -> set[int]:
    """The line numbers inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def runtime_imports(path: Path, code: str | None = None) -> set[str]:
    """The teachkit modules ``path`` (or ``code`` placed at ``path``) imports, at the top or in a function."""
    code = path.read_text() if code is None else code
    skipped = type_checking_lines(code)
    return {target for line, target in imports(path, code) if line not in skipped}


def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the teachkit modules it imports; ``sources`` (module -> code) replaces those modules' text."""
    sources = sources or {}
    return {module_name(path): runtime_imports(path, sources.get(module_name(path))) for path in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]`` (depth-first search over the modules in name order), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph.get(module, ())):
            if target in on_path:
                return path[path.index(target):] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_finds_a_lazy_cycle():
    """The report modules' former cycle (a table module importing the plots lazily, the plots importing the table
    at the top) is caught, function-level import and all."""
    table = (SRC / "experiments" / "report_table.py").read_text()
    lazy = table + "\n\ndef _draw(report):\n    from teachkit.experiments.report_plots import write_plots\n"
    graph = import_graph({"teachkit.experiments.report_table": lazy})
    report_modules = {m: {t for t in ts if t.startswith("teachkit.experiments.report")}
                      for m, ts in graph.items() if m.startswith("teachkit.experiments.report")}
    cycle = find_cycle(report_modules)
    assert cycle is not None and set(cycle) == {"teachkit.experiments.report_table",
                                                "teachkit.experiments.report_plots"}, cycle


def test_annotation_only_imports_are_no_edges():
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from teachkit.engine.trainer import Trainer\n"
            "def f():\n    from teachkit.recipes import kd\n")
    assert runtime_imports(SRC / "engine" / "callbacks.py", code) == {"teachkit.recipes.kd"}


def test_the_checker_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None  # a diamond is no cycle
