"""The layering rules, checked on the source (scripts/import_graph.py draws the whole graph):
above `backends/` only the contract is imported; the engine imports nothing above it."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
assert spec is not None and spec.loader is not None
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)

ABOVE = ("hearth.api", "hearth.sessions", "hearth.observability", "hearth.cli")
COMPOSITION_ROOT = "hearth.cli.main"  # builds the backend for `serve`


@functools.cache
def module_imports() -> dict[str, set[str]]:
    return {import_graph.module_of(p): import_graph.imports(p) for p in sorted((ROOT / "hearth").rglob("*.py"))}


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
