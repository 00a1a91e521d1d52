"""The Batch API on /metrics, the shapes the node and the gateway share: batches by status,
lines finished by tenant and result. Each side counts its own way (the node from its batches in
memory, the gateway from its database and what it ran: api/batches/metrics.py,
gateway/batches/metrics.py) and hands the numbers here."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hearth.observability.metrics import tenant_label

# OpenAI's batch statuses, each always present (0 when none), so a dashboard's series exist
STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
RESULTS = ("completed", "failed")


def by_status(name: str, doc: str, counts: Mapping[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["status"])
    for status in (*STATUSES, *sorted(set(counts) - set(STATUSES))):
        family.add_metric([status], counts.get(status, 0))
    return family


def lines_by_tenant(name: str, doc: str, counts: Mapping[tuple[str, str], int]) -> CounterMetricFamily:
    """`counts`: (tenant, "completed" or "failed") -> lines."""
    family = CounterMetricFamily(name, doc, labels=["tenant", "result"])
    for (tenant, result), n in sorted(counts.items()):
        family.add_metric([tenant_label(tenant), result], n)
    return family
