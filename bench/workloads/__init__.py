"""Workload registry: one module per workload, run in this order against every server."""

from __future__ import annotations

from bench.workloads.base import Workload, WorkloadContext, WorkloadResult
from bench.workloads.cancel_latency import CancelLatency
from bench.workloads.concurrent import Concurrent
from bench.workloads.single_stream import SingleStream

WORKLOADS: list[Workload] = [SingleStream(), Concurrent(), CancelLatency()]
# Short names accepted by --workloads (besides each workload's `name`).
ALIASES = {"single": "single_stream", "cancel_latency": "cancel"}
DEFAULT_WORKLOADS = ("single_stream", "concurrent")  # cancel only when asked (~1200 requests per run)


def select(names: list[str]) -> list[Workload]:
    """Workloads by name, in registry order; unknown names raise SystemExit."""
    wanted = {ALIASES.get(n, n) for n in names}
    known = {w.name for w in WORKLOADS}
    unknown = wanted - known
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    return [w for w in WORKLOADS if w.name in wanted]


__all__ = ["DEFAULT_WORKLOADS", "WORKLOADS", "Workload", "WorkloadContext", "WorkloadResult", "select"]
