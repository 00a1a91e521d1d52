"""Workload registry: one module per workload, run in this order against every server."""

from __future__ import annotations

from bench.workloads.base import Workload, WorkloadContext, WorkloadResult
from bench.workloads.concurrent import Concurrent
from bench.workloads.single_stream import SingleStream

WORKLOADS: list[Workload] = [SingleStream(), Concurrent()]

__all__ = ["WORKLOADS", "Workload", "WorkloadContext", "WorkloadResult"]
