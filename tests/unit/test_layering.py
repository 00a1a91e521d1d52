"""The layering rules, checked on the source (scripts/import_graph.py draws the whole graph):
every package has a floor and imports only from its own floor or below; above `backends/` only
the contract is imported; the engine imports nothing above it."""

from __future__ import annotations

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
    {"hearth", "ids", "text", "jsonsafe", "hashing", "tenants", "test_gate"},  # leaf utilities
    {"engine"},  # the step loop: tokens and KV, no protocols, no HTTP, no HearthError
    {"errors", "config", "db", "gguf", "embed_convert", "catalog", "models", "retrieval"},  # the ground floor
    {"chat"},  # protocol-neutral conversations
    {"backends.base"},  # the contract
    {"backends.admission", "backends.prompt_size", "backends.llamacpp", "backends.local",
     "backends.build"},  # the concrete backend and its composition
    {"sessions", "observability"},
    {"api"},  # a node's HTTP server
    {"gateway"},  # HTTP in front of a fleet of nodes
    {"cli"},  # the top: nothing imports it
]
FLOOR = {package: i for i, floor in enumerate(FLOORS) for package in floor}
ABOVE = ("hearth.api", "hearth.sessions", "hearth.observability", "hearth.gateway", "hearth.cli")
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
