"""The package's layers never import upwards: parsed from every import statement of every module (including
imports inside functions), not from what happens to be loaded at run time.

    errors < registry, trust < options, types, distributed < data < models < losses < engine < tasks < config < recipes
    < experiments, predict < cli, api

(the package root ``teachkit/__init__.py`` sits above everything: importing ``teachkit`` registers it all).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "teachkit"

#: (module prefix, rank): a module may import modules of its own rank or lower.
LAYERS = [
    ("teachkit.errors", 0),
    ("teachkit.registry", 1),
    ("teachkit.trust", 1),
    ("teachkit.options", 2),
    ("teachkit.types", 2),
    ("teachkit.distributed", 2),
    ("teachkit.data", 3),
    ("teachkit.models", 4),
    ("teachkit.losses", 5),
    ("teachkit.engine", 6),
    ("teachkit.tasks", 7),
    ("teachkit.config", 8),
    ("teachkit.recipes", 9),
    ("teachkit.experiments", 10),
    ("teachkit.predict", 10),
    ("teachkit.cli", 11),
    ("teachkit.api", 11),
    ("teachkit", 12),  # the package root
]


def rank(module: str) -> int:
    for prefix, r in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return r
    raise AssertionError(f"module {module} belongs to no layer: add it to LAYERS and to docs/design.md")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, code: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every teachkit import in ``path`` (or in ``code`` placed at ``path``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if code is None else code, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "teachkit"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "teachkit":
                continue
            # ``from teachkit.recipes import l2t`` imports the submodule teachkit.recipes.l2t
            found += [(node.lineno, f"{target}.{a.name}" if is_module(f"{target}.{a.name}") else target)
                      for a in node.names]
    return found


def is_module(name: str) -> bool:
    path = SRC.parent / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


MODULES = sorted(SRC.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in MODULES:
        rank(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_upward_import(path):
    source = module_name(path)
    for line, target in imports(path):
        assert rank(target) <= rank(source), (f"{path.relative_to(SRC.parent)}:{line}: {source} (layer {rank(source)}) "
                                              f"imports {target} (layer {rank(target)}), a layer above it")


def test_the_checker_sees_an_upward_import():
    """The parser catches late imports inside functions, relative imports and from-imports."""
    code = "def f():\n    from teachkit.recipes.common import load_data\n    from ..recipes import kd\n"
    targets = [t for _, t in imports(SRC / "engine" / "trainer.py", code)]
    assert targets == ["teachkit.recipes.common", "teachkit.recipes.kd"]
    assert all(rank(t) > rank("teachkit.engine.trainer") for t in targets)
