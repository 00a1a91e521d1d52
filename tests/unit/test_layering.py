"""The layering rules, checked on the source (scripts/import_graph.py draws the whole graph):
every package has a floor and imports only from its own floor or below; above `backends/` only
the contract is imported; the engine imports nothing above it."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert spec is not None and spec.loader is not None
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)

# The floors, lowest first. A package not listed fails the first test: a new one must be placed.
FLOORS: list[set[str]] = [
    {"hearth", "ids", "text", "jsonsafe", "hashing", "tenants", "test_gate",
     "fleet_protocol"},  # leaf utilities (fleet_protocol: the node <-> gateway shapes)
    {"engine"},  # the step loop: tokens and KV, no protocols, no HTTP, no HearthError
    {"errors", "config", "db", "gguf", "embed_convert", "catalog", "models", "retrieval"},  # the ground floor
    {"chat"},  # protocol-neutral conversations
    {"backends.base"},  # the contract
    {"backends.llamacpp", "backends.local", "backends.build"},  # the concrete backend and its composition
    {"sessions", "observability"},
    {"http"},  # the HTTP edge the node and the gateway share
    {"protocols"},  # protocol facts both products speak (event logs, error events, names)
    {"api"},  # a node's HTTP server
    {"gateway"},  # HTTP in front of a fleet of nodes
    {"cli"},  # the top: nothing imports it
]
FLOOR = {package: i for i, floor in enumerate(FLOORS) for package in floor}
ABOVE = ("hearth.api", "hearth.http", "hearth.protocols", "hearth.sessions", "hearth.observability", "hearth.gateway",
         "hearth.cli")
COMPOSITION_ROOT = "hearth.cli.main"  # builds the backend for `serve`


@functools.cache
def module_imports() -> dict[str, set[str]]:
    return {import_graph.module_of(p): import_graph.imports(p) for p in sorted((ROOT / "hearth").rglob("*.py"))}


def test_every_package_imports_only_from_its_floor_or_below() -> None:
    graph = import_graph.graph()
    unplaced = sorted({p for src, dsts in graph.items() for p in (src, *dsts)} - FLOOR.keys())
    assert unplaced == []
    upward = [f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts if FLOOR[dst] > FLOOR[src]]
    assert upward == []


def test_nothing_imports_the_cli() -> None:
    assert [src for src, dsts in import_graph.graph().items() if "cli" in dsts] == []


def test_nothing_above_backends_imports_a_concrete_backend_engine_or_runner() -> None:
    bad = []
    for src, dsts in module_imports().items():
        if not src.startswith(ABOVE):
            continue
        for dst in dsts:
            allowed = dst == "hearth.backends.base" or (src == COMPOSITION_ROOT and dst == "hearth.backends.build")
            if (dst.startswith("hearth.backends") and not allowed) or dst.startswith("hearth.engine"):
                bad.append(f"{src} -> {dst}")
    assert bad == []


def test_the_engine_imports_nothing_above_it() -> None:
    above = ("hearth.api", "hearth.sessions", "hearth.backends", "hearth.chat", "hearth.cli",
             "hearth.observability", "hearth.errors")
    bad = [f"{src} -> {dst}" for src, dsts in module_imports().items() if src.startswith("hearth.engine")
           for dst in dsts if dst.startswith(above)]
    assert bad == []


def test_config_imports_no_parsers() -> None:
    assert not {d for d in module_imports()["hearth.config"] if d.startswith("hearth.chat")}


def test_the_cancel_registry_lives_with_the_http_layer() -> None:
    users = {src for src, dsts in module_imports().items() if "hearth.api.http.cancels" in dsts}
    assert users and all(u.startswith("hearth.api") for u in users)


# The gateway's own floors, lowest first (docs/gateway.md, "Code map"): a subpackage or top-level
# module of hearth.gateway imports only from its own floor or below.
GATEWAY_FLOORS: list[set[str]] = [
    {"settings", "metrics", "protocols"},  # what the fleet is, what is counted, the client protocols' streams
    {"routing"},  # pure decisions, and the one spelling of an affinity key (the store uses it)
    {"store"},  # the database
    {"tenancy", "upstream"},  # who owns what; talking to a node
    {"fleet"},  # which nodes exist and how each one is doing
    {"failover"},  # what happens when a node fails
    {"turn", "foreign"},  # one generation request; engines behind the node's protocol layer
    {"background", "batches"},  # gateway-run background responses and Batch API lines
    {"state"},  # what the routes see
    {"edge"},  # HTTP in and out
    {"app"},  # the composition root
]
GATEWAY_FLOOR = {part: i for i, floor in enumerate(GATEWAY_FLOORS) for part in floor}


def gateway_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["hearth", "gateway"] else None


def test_gateway_parts_import_only_from_their_floor_or_below() -> None:
    parts = {gateway_part(m) for m in module_imports()} - {None}
    assert sorted(p for p in parts if p not in GATEWAY_FLOOR) == []  # a new part must be placed
    upward = []
    for src, dsts in module_imports().items():
        a = gateway_part(src)
        for dst in dsts:
            b = gateway_part(dst)
            if a is not None and b is not None and a != b and GATEWAY_FLOOR[b] > GATEWAY_FLOOR[a]:
                upward.append(f"{src} -> {dst}")
    assert upward == []


def runtime_imports(path: Path) -> set[str]:
    """The hearth modules a file imports when it runs: top-level and function-level imports,
    not those under `if TYPE_CHECKING:`. `from hearth.x import y` counts as importing hearth.x.y
    when that is a module, else hearth.x."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("hearth"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in module_files() else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hearth."))
    return out


@functools.cache
def module_files() -> dict[str, Path]:
    return {import_graph.module_of(p): p for p in sorted((ROOT / "hearth").rglob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return found


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_run_time_import_cycle_in_hearth() -> None:
    """A cycle hidden by a function-level import still counts (it is one the day the import moves
    up); imports under `if TYPE_CHECKING:` do not (they never run)."""
    files = module_files()
    graph = {m: {d for d in runtime_imports(p) if d in files and d != m} for m, p in files.items()}
    assert cycles(graph) == []
