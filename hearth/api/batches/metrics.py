"""The node's batches on /metrics (hearth/http/batches/metrics.py has the shapes). Read from the
batches the node holds in memory (every batch under its data directory, loaded at start), on the
event loop that also changes them: no query, no lock.

- `hearth_batches{status}`: the node's batches by status;
- `hearth_batch_lines_total{tenant,result}`: lines finished, `completed` (a 2xx answer) or
  `failed` (an error line), by the tenant that owns the batch. Summed from the batches' own
  records, so it survives a restart and never counts a line twice;
- `hearth_batch_lines_pending{tenant}`: lines of live batches not finished yet.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.api.batches.store import LIVE, BatchStore
from hearth.http.batches.metrics import by_status, lines_by_tenant
from hearth.observability.metrics import tenant_label


class BatchCollector(Collector):
    def __init__(self, store: BatchStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        statuses: dict[str, int] = {}
        lines: dict[tuple[str, str], int] = {}
        pending: dict[str, int] = {}
        for b in self.store.load():
            statuses[b.status] = statuses.get(b.status, 0) + 1
            for result, n in (("completed", b.completed), ("failed", b.failed)):
                lines[b.owner, result] = lines.get((b.owner, result), 0) + n
            if b.status in LIVE:
                left = int(b.obj["request_counts"]["total"]) - b.completed - b.failed
                pending[b.owner] = pending.get(b.owner, 0) + max(0, left)
        yield by_status("hearth_batches", "Batches on this node, by status", statuses)
        yield lines_by_tenant("hearth_batch_lines", "Batch lines finished, by the batch owner's tenant and result "
                              "(completed: a 2xx answer; failed: an error line)", lines)
        family = GaugeMetricFamily("hearth_batch_lines_pending", "Lines of live batches not finished yet",
                                   labels=["tenant"])
        for tenant, n in sorted(pending.items()):
            family.add_metric([tenant_label(tenant)], n)
        yield family
