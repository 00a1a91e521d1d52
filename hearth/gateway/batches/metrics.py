"""The gateway's batches on /metrics (hearth/http/batches/metrics.py has the shapes):

- `hearth_gateway_batches{status}`: every batch in the gateway's database by status (all the
  gateways sharing one PostgreSQL report the same numbers), read by one GROUP BY over the
  batches table when /metrics is scraped (`refresh`; a failed read keeps the last numbers);
- `hearth_gateway_batch_lines_total{tenant,result}`: lines this gateway recorded since it
  started, `completed` (a 2xx answer) or `failed` (an error line), by the batch's tenant. Per
  gateway, so a fleet's total is the sum over its gateways; a line another gateway had already
  recorded is not counted again;
- `hearth_gateway_batches_running`: batches this gateway runs now.
A count of lines by tenant over the whole database would scan every line ever run at each
scrape: not done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.gateway.batches.runner import GatewayBatches
from hearth.http.batches.metrics import by_status, lines_by_tenant

log = logging.getLogger("hearth.gateway")


class GatewayBatchCollector(Collector):
    def __init__(self, batches: GatewayBatches) -> None:
        self.batches = batches
        self.statuses: dict[str, int] = {}

    async def refresh(self) -> None:
        """Read the batches by status from the store (before each render of /metrics)."""
        try:
            self.statuses = await self.batches.tables.statuses()
        except Exception as e:  # /metrics answers anyway, with the last numbers read
            log.warning("could not count the batches for /metrics: %s", e)

    def collect(self) -> Iterator[Metric]:
        yield by_status("hearth_gateway_batches", "Batches in the gateway's database, by status", self.statuses)
        yield lines_by_tenant("hearth_gateway_batch_lines", "Batch lines this gateway recorded, by tenant and "
                              "result (completed: a 2xx answer; failed: an error line)", dict(self.batches.lines))
        yield GaugeMetricFamily("hearth_gateway_batches_running", "Batches this gateway runs now",
                                value=self.batches.running)
