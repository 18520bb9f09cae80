"""The dependency rule between packages (docs/architecture.md), as import-linter checks it from pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_every_layering_contract_is_kept(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert (
        lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == EXIT_STATUS_SUCCESS
    )


def _cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected groups of modules (more than one module), by Tarjan's algorithm."""
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in imports.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_type_only_imports_included() -> None:
    graph = grimp.build_graph("polar", "db", "flows", "harness_adapters", cache_dir=None)
    assert _cycles(graph) == []


def _sibling_imports(graph: grimp.ImportGraph) -> dict[str, set[tuple[str, str]]]:
    """For each package, which of its children (sub-packages and modules) import which: a module importing another
    counts as an import between the two children of their deepest common package (``polar.proxy.call.plan`` ->
    ``polar.proxy.session.history`` is ``call`` -> ``session`` in ``polar.proxy``)."""
    found: dict[str, set[tuple[str, str]]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = module.split("."), imported.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if 0 < common < min(len(a), len(b)):
                found.setdefault(".".join(a[:common]), set()).add((a[common], b[common]))
    return found


def test_no_package_imports_a_package_that_imports_it_back() -> None:
    """At every depth (``polar``'s packages, ``polar.proxy``'s, ...) the packages and modules of one package form
    no cycle, type-only imports included: each package's children can be drawn in layers, like polar's own (the
    ``layers`` contract in pyproject.toml)."""
    graph = grimp.build_graph("polar", "db", "flows", "harness_adapters", cache_dir=None)
    cyclic = {}
    for package, pairs in sorted(_sibling_imports(graph).items()):
        children = grimp.ImportGraph()
        for importer, imported in pairs:
            children.add_import(importer=importer, imported=imported)
        if groups := _cycles(children):
            cyclic[package] = sorted(sorted(group) for group in groups)
    assert cyclic == {}


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    """Small modules with one job each: a module past this is split by what it does."""
    root = Path(__file__).resolve().parents[1]
    long = {
        str(path.relative_to(root)): n
        for package in ("polar", "db", "flows", "harness_adapters")
        for path in (root / package).rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_a_gateway_in_front_of_an_engine_server_loads_no_torch() -> None:
    """torch (a second and 200 MB per process) is loaded only by what runs or scores a local model: the gateway's
    server, its backends' registry, the model checks and the ``polar`` command's parser (which every ``polar
    gateway`` builds first) import none of it at start."""
    probe = (
        "import sys, polar.proxy.server, polar.backends.registry, polar.models.check, polar.backends.sglang; "
        "from polar.cli.entry import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
