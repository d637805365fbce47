"""The import layers of docs/architecture.md, checked on every ``import`` in src.

Walks the AST of every module, function-level (lazy) imports included, so a cycle broken with
a lazy import is still seen, between modules and between packages. Imports under
``if TYPE_CHECKING:`` are type-only: they count for the layers but not for cycles (they never
run). There are no exceptions: a crossing or a cycle is fixed, not listed.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "metricvault"

# The leaf: imports nothing of metricvault but other leaf modules.
LEAF = {
    "metricvault.allocator",
    "metricvault.errors",
    "metricvault.durations",
    "metricvault.model",
    "metricvault.experiment",
    "metricvault.protocols",
    "metricvault.config",
    "metricvault.credentials",
    "metricvault.fsutil",
    "metricvault.gitinfo",
    "metricvault.selector",
    "metricvault.redact",
    "metricvault.wire",
    "metricvault.tables",  # the output shapes (pandas, arrow, polars) of every query API
    "metricvault.progressbar",  # rich bars for the store's progress callbacks
    "metricvault.memory",  # malloc_trim for the agent and the gateway's workers
    "metricvault.client_auth",  # the Authorization header of the push and Alertmanager clients
    "metricvault.compiled",  # loads numba-compiled modules (by name, on a thread)
}

# Which layers each layer may import (its own always).
MAY_IMPORT: dict[str, set[str]] = {
    "leaf": set(),
    "store": {"leaf"},  # every backend, the gateway client included; nothing above
    "promql": {"leaf"},  # the engine reads through the leaf's read seam (protocols)
    "archive": {"leaf", "store"},
    "decoders": {"leaf"},  # ingest/: pure decoding (schemas in the leaf wire/)
    # the cluster simulator: numbers from a spec, no store; the agent's simulated GPU source
    # runs it, so collect may import it (sim.workload's pyarrow frames stay out of the agent:
    # test_collect_agent.py checks what the agent process loads)
    "sim": {"leaf"},
    # read routes: the engine; the UI: experiments history and compare (archive); upkeep: the
    # online anomaly scores after each maintenance round (analysis never imports server)
    "server": {"leaf", "store", "decoders", "open", "promql", "rules", "archive", "analysis"},
    # alert and recording rules: read through the engine, write through the store's write
    # protocol (the leaf); store for the evaluator's lease (conditional writes on s3)
    "rules": {"leaf", "store", "promql"},
    # baselines and anomaly scores: read through the public API and the engine, write through
    # the store's write path; a peer of rules (neither imports the other)
    "analysis": {"leaf", "store", "promql", "open"},
    "collect": {"leaf", "open", "sim"},  # reaches a store only through metricvault.open
    # metricvault.open and metricvault.public: the dispatcher and the public classes, which
    # add the conveniences above the store (history, promql, progress bars, Vault.open)
    "open": {"leaf", "store", "archive", "promql"},
    "app": {
        "leaf",
        "store",
        "promql",
        "archive",
        "decoders",
        "server",
        "collect",
        "open",
        "sim",
        "rules",
        "analysis",
    },
    "top": {
        "leaf",
        "store",
        "promql",
        "archive",
        "server",
        "collect",
        "open",
        "sim",
        "app",
        "cli",
        "rules",
        "analysis",
    },
    "cli": {
        "leaf",
        "store",
        "promql",
        "archive",
        "decoders",
        "server",
        "collect",
        "open",
        "sim",
        "app",
        "rules",
        "analysis",
    },
}

# Package-level: a module of one package never imports (at run time, lazily or not) a module
# of a package that imports it back.
PACKAGES = (
    "store", "promql", "archive", "ingest", "server", "collect", "cli", "sim", "wire", "rules",
    "analysis",
)  # fmt: skip


def layer(module: str) -> str:
    if module == "metricvault":  # the package: the public names, imported lazily, and open
        return "top"
    if module in LEAF or any(module.startswith(m + ".") for m in LEAF - {"metricvault"}):
        return "leaf"
    parts = module.split(".")
    if len(parts) < 2:
        return "leaf"
    top = parts[1]
    if top == "ingest":  # the wire decoders (ingest/protocols): bytes -> batches, pure
        return "decoders"
    if top in ("public", "public_influx", "conveniences"):  # the public classes
        return "open"
    if top in PACKAGES or top == "open":
        return top
    return "app"  # report, demo, demo_archive, prometheus_config


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, known: set[str], name: str = "") -> list[tuple[str, bool]]:
    """(imported metricvault module, runtime?) for every import in the file, at any depth."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def target(mod: str) -> str:
        while mod not in known and "." in mod:  # `from pkg import name`: the package
            mod = mod.rpartition(".")[0]
        return mod

    def visit(node: ast.AST, runtime: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit_stmt(sub, False)
                for sub in child.orelse:
                    visit_stmt(sub, runtime)
                continue
            visit_stmt(child, runtime)

    def visit_stmt(node: ast.AST, runtime: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("metricvault"):
                    found.append((target(alias.name), runtime))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("metricvault"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in known else target(base), runtime))
        visit(node, runtime)

    visit(ast.parse(path.read_text(), str(path)), True)
    return [(m, r) for m, r in found if m != name]


@functools.cache  # parsed once per run: four tests walk the same sources
def graph() -> dict[str, list[tuple[str, bool]]]:
    files = sorted(SRC.rglob("*.py"))
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) for p in files}


def crossings() -> set[tuple[str, str]]:
    bad = set()
    for mod, deps in graph().items():
        mine = layer(mod)
        for dep, _ in deps:
            if dep == "metricvault":  # ``from metricvault import __version__``: a constant
                continue
            theirs = layer(dep)
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                bad.add((mod, dep))
    return bad


def test_no_module_imports_across_the_layers():
    bad = sorted(crossings())
    assert not bad, (
        f"{len(bad)} import(s) cross the layers of docs/architecture.md (module -> what it "
        f"imports, layer -> layer): "
        + "; ".join(f"{a} -> {b} ({layer(a)} -> {layer(b)})" for a, b in bad)
        + ". Move the shared code down a layer (e.g. into a leaf module), or pass it in"
    )


def _runtime_edges() -> dict[str, list[str]]:
    # ``from metricvault import __version__`` is a constant, not a dependency on the package
    return {
        m: sorted({d for d, runtime in deps if runtime and d != "metricvault"})
        for m, deps in graph().items()
    }


def test_no_import_cycles_among_modules():
    cycles = _cycles(_runtime_edges())
    assert not cycles, "import cycles (lazy imports included): " + "; ".join(
        " -> ".join([*c, c[0]]) for c in cycles
    )


def package(module: str) -> str:
    """``metricvault.store`` for ``metricvault.store.backends.influxdb``; a top-level module
    (``metricvault.open``) is its own package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def package_edges() -> dict[str, list[str]]:
    edges: dict[str, set[str]] = {}
    for module, deps in _runtime_edges().items():
        for dep in deps:
            if package(dep) != package(module):
                edges.setdefault(package(module), set()).add(package(dep))
    return {p: sorted(d) for p, d in edges.items()}


def test_no_import_cycles_among_packages():
    """store -> archive -> store through a lazy import is a cycle too."""
    edges = package_edges()
    cycles = _cycles(edges)
    why = [
        f"{m} -> {d}"
        for c in cycles
        for m, deps in _runtime_edges().items()
        for d in deps
        if package(m) in c and package(d) in c and package(m) != package(d)
    ]
    assert not cycles, f"package cycles {cycles}, through: {'; '.join(why)}"
    assert {f"metricvault.{p}" for p in PACKAGES} <= set(edges), "the check sees every package"


def test_the_store_and_the_engine_import_nothing_above_them():
    """Not even type-only: the store implements the leaf's protocols, the engine reads them."""
    for mod, deps in graph().items():
        if layer(mod) in ("store", "promql"):
            above = sorted({d for d, _ in deps if layer(d) not in ("leaf", layer(mod))})
            assert not above, f"{mod} imports {above}"


def _cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


@pytest.mark.parametrize(
    ("source", "runtime"),
    [
        ("def f():\n    from metricvault.store.vault import Vault\n", True),
        ("if TYPE_CHECKING:\n    from metricvault.store.vault import Vault\n", False),
        ("from .vault import Vault\n", True),
    ],
)
def test_the_check_sees_lazy_and_relative_imports(tmp_path, source, runtime):
    """A function-level import counts for cycles; a TYPE_CHECKING one never runs."""
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    found = imports_of(probe, {"metricvault.store.vault"}, name="metricvault.store.probe")
    assert found == [("metricvault.store.vault", runtime)]
