"""The layering of ARCHITECTURE.md, read from the source: every module sits in one layer and
imports only from its own layer or below, no import cycle exists, no in-function import
dodges one, and only the Dagster-facing code and the apps import Dagster.

Layers, bottom-up: model, engines, storage, behaviour, facade, Dagster, apps (the engines
import only the model, and the notebook in storage embeds what it saves). A new module must
be placed in ``LAYERS`` before this test passes: where it goes is a design decision."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memory_pipelines", "assets", "resources", "sensors", "jobs")

#: layer -> module prefixes, dotted and relative to ``memory_pipelines``; ``/name`` is a
#: top-level package, ``=name`` exactly that module (the package root)
LAYERS: dict[str, tuple[str, ...]] = {
    "model": (
        "errors",
        "notes",
        "config",
        "text",
        "limits",
        "clock",
        "note_events",
        "litellm_loader",
        "retries",
        "blas",
    ),
    "engines": ("embeddings", "judge"),
    "storage": ("store", "storage", "sources", "notebook", "home", "partitions"),
    "behaviour": (
        "context",
        "agents",
        "scope",
        "writes",
        "injection",
        "phases",
        "explain",
        "history",
        "purge",
        "inventory",
        "keys",
        "admin",
    ),
    "facade": ("service", "memory_manager", "plots", "=memory_pipelines"),
    "dagster": ("definitions", "/assets", "/resources", "/sensors", "/jobs"),
    "apps": ("apps", "bench"),
}
RANK = {name: i for i, name in enumerate(LAYERS)}
DOMAIN = {"model", "storage", "engines", "behaviour", "facade"}

#: In-function imports of project modules that are not there to dodge a cycle.
LAZY_OK = {
    # the Dask executor needs the optional `distributed` extra
    ("jobs.executors", "jobs.dask_executor"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool
    type_checking: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _canonical(name: str) -> str:
    """``memory_pipelines.assets.x`` -> ``assets.x``: the Dagster folders are installed (and
    imported) as subpackages of memory_pipelines but sit at the checkout's top level."""
    head, _, rest = name.partition(".")
    if head == "memory_pipelines" and rest.split(".")[0] in PACKAGES[1:]:
        return rest
    return name


def _targets(importer: str, is_package: bool, node: ast.AST) -> list[str]:
    """The project modules an import statement loads (``from pkg import sub`` -> pkg.sub)."""
    if isinstance(node, ast.Import):
        names = [_canonical(a.name) for a in node.names]
    else:
        module = _canonical(_resolve(importer, is_package, node))
        names = [
            _canonical(f"{module}.{a.name}")
            if _canonical(f"{module}.{a.name}") in MODULES
            else module
            for a in node.names
        ]
    return [n for n in names if n.split(".")[0] in PACKAGES or n.split(".")[0] == "dagster"]


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, in_function, True)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_package, child):
                    out.append(Import(module, target, child.lineno, in_function, type_checking))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, type_checking)
            else:
                visit(child, in_function, type_checking)

    visit(tree, False, False)
    return out


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _full(prefix: str) -> str:
    if prefix.startswith(("=", "/")):
        return prefix[1:]
    return f"memory_pipelines.{prefix}"


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            if prefix.startswith("="):
                if module == prefix[1:]:
                    return layer
                continue
            full = _full(prefix)
            if module == full or module.startswith(full + "."):
                if best is None or len(full) > best[0]:
                    best = (len(full), layer)
    return best[1] if best else None


def _where(imp: Import) -> str:
    return f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line} imports {imp.imported}"


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, f"place these modules in a layer of LAYERS: {unplaced}"


def test_every_layer_entry_names_a_module():
    """A stale entry (a module moved or removed) would silently place a future module of
    that name; every prefix of ``LAYERS`` names at least one module of the tree."""
    stale = sorted(
        f"{layer}: {prefix}"
        for layer, prefixes in LAYERS.items()
        for prefix in prefixes
        if not any(m == _full(prefix) or m.startswith(_full(prefix) + ".") for m in MODULES)
    )
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def _upward(imports: list[Import], modules: set[str]) -> list[Import]:
    """The imports of a project module by a module of a lower layer."""
    return [
        imp
        for imp in imports
        if imp.imported in modules
        and layer_of(imp.importer)
        and layer_of(imp.imported)
        and RANK[layer_of(imp.imported)] > RANK[layer_of(imp.importer)]
    ]


def test_no_upward_import():
    upward = [
        f"{_where(imp)} ({layer_of(imp.importer)} -> {layer_of(imp.imported)})"
        for imp in _upward(IMPORTS, set(MODULES))
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_upward_check_finds_an_upward_import():
    down = Import("memory_pipelines.history.read", "memory_pipelines.scope", 1, False, False)
    up = Import("memory_pipelines.history.read", "memory_pipelines.explain", 2, False, False)
    modules = {"memory_pipelines.scope", "memory_pipelines.explain"}
    assert _upward([down, up], modules) == []  # explain and history share the behaviour layer
    model_up = Import("memory_pipelines.notes", "memory_pipelines.scope", 3, False, False)
    assert _upward([down, model_up], modules) == [model_up]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycle():
    edges: dict[str, set[str]] = {}
    for imp in IMPORTS:
        if imp.imported in MODULES and imp.imported != imp.importer:
            edges.setdefault(imp.importer, set()).add(imp.imported)
    assert not _cycles(edges), f"import cycles: {_cycles(edges)}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_in_function_import_of_project_code():
    """Lazy project imports hide cycles; only entry points (apps, bench) load commands
    lazily, for start-up time."""
    lazy = [
        _where(imp)
        for imp in IMPORTS
        if imp.in_function
        and imp.imported.split(".")[0] in PACKAGES
        and layer_of(imp.importer) != "apps"
        and (imp.importer, imp.imported) not in LAZY_OK
    ]
    assert not lazy, "in-function imports:\n" + "\n".join(lazy)


def test_the_domain_does_not_import_dagster():
    leaks = [
        _where(imp)
        for imp in IMPORTS
        if imp.imported.split(".")[0] == "dagster" and layer_of(imp.importer) in DOMAIN
    ]
    assert not leaks, "Dagster imported by the domain:\n" + "\n".join(leaks)


@pytest.mark.parametrize("folder", ["tests", "memory_pipelines", "assets", "resources"])
def test_no_dagster_internals(folder):
    """Dagster's private modules change between releases; only the custom Dask executor
    (jobs/dask_executor.py) builds on them, as dagster-dask itself does."""
    hits = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            hits += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("dagster._")]
    assert not hits, hits


#: The columns that decide who sees a note: a store filter on one of them is a scope rule.
SCOPE_COLUMNS = {
    "user_id",
    "company_id",
    "primary_scope_entity_id",
    "primary_scope_record_id",
    "secondary_scopes",
}
#: The store's filter builders (memory_pipelines.store.filters).
FILTER_BUILDERS = {"eq", "ne", "is_null", "not_null", "in_", "cmp", "icontains"}
#: Filters on those columns that are not visibility: erasing a user's data finds every row
#: of the user, whatever the scope.
SCOPE_FILTER_OK = {"memory_pipelines.purge"}


def _scope_filters(module: str, path: Path) -> list[str]:
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        first = node.args[0]
        if (
            name in FILTER_BUILDERS
            and isinstance(first, ast.Constant)
            and first.value in SCOPE_COLUMNS
        ):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}({first.value!r}, ...)")
    return hits


def test_scope_filters_are_built_only_by_the_scope_package():
    """Scope is the security boundary: the lattice, the multi-tenant prefilter and the key
    bindings are built in memory_pipelines/scope, and every path (inject, write, explain,
    history, admin, the memory browser, export, the proxy) asks it."""
    outside = [
        hit
        for module, path in MODULES.items()
        if layer_of(module) in DOMAIN | {"dagster"}
        and not module.startswith("memory_pipelines.scope")
        and module not in SCOPE_FILTER_OK
        for hit in _scope_filters(module, path)
    ]
    assert not outside, "scope filters built outside memory_pipelines.scope:\n" + "\n".join(outside)


def test_the_scope_filter_check_finds_one():
    path = ROOT / "memory_pipelines" / "scope" / "prefilter.py"
    assert any(
        "'user_id'" in hit for hit in _scope_filters("memory_pipelines.scope.prefilter", path)
    )
