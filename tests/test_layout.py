"""The package's layout: no import circle between paramscope's modules, and one CLI module per command.

Imports are read with `ast`, not by importing: module-level, function-level and `if TYPE_CHECKING:` imports all
count (a function-level import is a circle deferred, not removed; a type hint's import is a dependency all the same).
Results find their notebook pages by type name (display.PAGES), so no data module imports a renderer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import paramscope

PACKAGE_DIR = Path(paramscope.__file__).parent

# Circles knowingly left, each with its reason. Keep it empty.
ALLOWED_CIRCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = ("paramscope", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(nodes):
    """Every import statement in `nodes`, at any depth, `if TYPE_CHECKING:` blocks included."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _runtime_imports(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """paramscope module → the paramscope modules it imports (a package's name stands for its __init__)."""
    files = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports([ast.parse(path.read_text("utf-8"), str(path))]):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from X import y` imports the module X.y when there is one, else the name y from X
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """One circle through each strongly connected group of modules (depth-first search), smallest name first."""
    circles, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circle = tuple(stack[stack.index(target):])
                start = circle.index(min(circle))
                circles.append(circle[start:] + circle[:start])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return circles


def test_the_graph_sees_function_level_relative_and_package_imports():
    graph = import_graph()
    assert "paramscope.errors" in graph["paramscope"]  # a package's __init__, relative import
    assert "paramscope.render.text" in graph["paramscope.cli.inspect"]  # function-level, two dots deep
    assert "paramscope.cli._common" in graph["paramscope.cli.formula"]
    assert "paramscope.report" in graph["paramscope.render.text"]  # for type hints only, and counted
    assert not any(t.startswith("paramscope.render") for t in graph["paramscope.report"])  # data never draws itself


def test_the_circle_finder_finds_a_circle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_circles(graph) == [("a", "b", "c")]
    assert find_circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_paramscope():
    circles = [c for c in find_circles(import_graph()) if c not in ALLOWED_CIRCLES]
    assert not circles, "import circles: " + "; ".join(" → ".join(c + c[:1]) for c in circles)


def test_each_cli_command_module_imports_only_the_shared_options_and_the_library():
    graph = import_graph()
    # the shared modules (_common: options and output; _recording: what is recorded after a build) are private
    shared = {m for m in graph if m.startswith("paramscope.cli._")}
    commands = [m for m in graph if m.startswith("paramscope.cli.") and m not in shared]
    assert {m.rpartition(".")[2] for m in commands} >= {"inspect", "formula", "diff", "compare", "audit", "presets"}
    for module in commands:
        cli_imports = {t for t in graph[module] if t == "paramscope.cli" or t.startswith("paramscope.cli.")}
        assert cli_imports and cli_imports <= shared, (module, cli_imports)
    for module in shared:
        assert not {t for t in graph[module] if t in commands}, module  # the shared never import a command


def test_importing_the_cli_and_its_commands_stays_light():
    code = ("import sys, paramscope.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'rich', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_registered_display_names_a_page_that_exists():
    import importlib
    import inspect

    from paramscope.display import PAGES, TEXTS

    for registry, arity in ((PAGES, 2), (TEXTS, 1)):
        for type_name, target in registry.items():
            module, _, name = target.partition(":")
            function = getattr(importlib.import_module(module), name)
            assert len(inspect.signature(function).parameters) == arity, (type_name, target)
    classes = {"Report": "paramscope.report", "MemoryEstimate": "paramscope.cost.memory.result",
               "FlopEstimate": "paramscope.cost.flops.result", "Plan": "paramscope.plan",
               "ServeSpeed": "paramscope.cost.speed.roofline", "LayoutSearch": "paramscope.cost.parallel.search"}
    assert set(PAGES) == set(classes)
    for type_name, module in classes.items():
        assert hasattr(importlib.import_module(module), type_name)


def test_no_module_imports_another_modules_private_name():
    """A name starting with '_' is its module's own: what others need is public (issue 26's reaches into _Deriver)."""
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("paramscope")):
                offenders += [f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not offenders, offenders
