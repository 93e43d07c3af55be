"""The package's modules import each other down its layers and without a cycle (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mtplab"


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from its __init__.py)."""
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def imported(node: ast.ImportFrom | ast.Import, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement may load: the module itself and each name as a submodule."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names]


def imports(tree: ast.AST):
    """Every import statement at any depth, those under `if TYPE_CHECKING:` included (a type hint names a layer too)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from imports(node)


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, at any level of the file (functions included)."""
    mods = module_files()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in imports(ast.parse(path.read_text(), str(path))):
            names = [n for n in imported(node, module, path.name == "__init__.py") if n in mods and n != module]
            submodules = [n for n in names if n.rsplit(".", 1)[0] in names]
            # `from . import store` loads the submodule store, not a cycle through the package itself
            graph[module].update(submodules or names)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if not state.get(nxt) and (cycle := visit(nxt, path)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if not state.get(start) and (cycle := visit(start, [])):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "mtplab.sweep.pool" in graph and graph["mtplab.sweep.pool"]  # the graph is read, not empty
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_named():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_count():
    graph = import_graph()
    assert "mtplab.sweep.cluster" in graph["mtplab.sweep.pool"]  # make_pool imports RayPool inside the function


# The layers, bottom to top (ARCHITECTURE.md): a module imports from its own layer and the ones below it only.
LAYERS = ("base", "model", "runtime", "engine", "check", "measure", "experiment", "sweep", "report", "cli")


def layer_of(module: str) -> int:
    """A module's layer index: its sub-package's place in LAYERS (the package itself is the bottom, __main__ the top)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up the layers, as 'importer -> imported'."""
    return [f"{m} -> {d}" for m in sorted(graph) for d in sorted(graph[m]) if layer_of(d) > layer_of(m)]


def test_every_module_sits_in_a_layer():
    unplaced = [m for m in module_files() if m.count(".") >= 1 and m.split(".")[1] not in (*LAYERS, "__main__")]
    assert unplaced == []


def test_imports_go_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_named():
    graph = {"mtplab.model.artifact": {"mtplab.sweep.store"}, "mtplab.sweep.store": {"mtplab.model.artifact"}}
    assert upward_imports(graph) == ["mtplab.model.artifact -> mtplab.sweep.store"]


def test_every_module_is_named_in_the_architecture_page_under_its_layer():
    """ARCHITECTURE.md's layer table names each module of each sub-package (a new module is placed there too)."""
    rows = {}
    for line in (PACKAGE.parent / "ARCHITECTURE.md").read_text().splitlines():
        if line.startswith("| `") and "/` |" in line:
            layer = line.split("`")[1].rstrip("/")
            rows[layer] = line.split("|")[2]
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 2 and parts[1] != "__init__.py" and f"`{parts[1]}`" not in rows.get(parts[0], ""):
            missing.append("/".join(parts))
    assert not missing, f"modules missing from ARCHITECTURE.md's layer table: {missing}"


def test_every_import_the_readme_and_docs_show_resolves():
    """A newcomer pastes the README's Python example first: each `from X import a` in a ```python block of README.md
    or docs/*.md names a module and a name that exist."""
    import importlib
    import re

    root = PACKAGE.parent
    missing = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mtplab"):
                    module = importlib.import_module(node.module)
                    missing += [f"{page.name}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert not missing, missing
