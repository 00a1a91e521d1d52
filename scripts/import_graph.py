#!/usr/bin/env python3
"""Print which hearth package imports which (from the source, by `ast`), one line per package:
`api -> backends.base, chat, ...`. Top-level modules (config, errors, ids, ...) count as their
own package; `backends` is split one level down, since its base module is the contract, build
the composition root, and each folder (local, llamacpp) a concrete family. Usage: scripts/import_graph.py [--modules]"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "hearth"


def imports(path: Path) -> set[str]:
    """The hearth modules a file imports (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "hearth":  # a submodule, or a name from hearth/__init__.py
                out.update(f"hearth.{a.name}" if (ROOT / a.name).exists() or (ROOT / f"{a.name}.py").exists()
                           else "hearth" for a in node.names)
            elif node.module.startswith("hearth."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hearth."))
    return out


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "hearth"
    if parts[0] == "backends" and len(parts) > 1:
        return f"backends.{parts[1]}"
    return parts[0]


def graph(by_module: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        src = module_of(path)
        for dst in imports(path):
            a, b = (src, dst) if by_module else (group(src), group(dst))
            if a != b:
                edges[a].add(b)
    return edges


if __name__ == "__main__":
    for src, dsts in sorted(graph("--modules" in sys.argv).items()):
        print(f"{src} -> {', '.join(sorted(dsts))}")
