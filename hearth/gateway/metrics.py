"""The gateway's Prometheus metrics: per node in-flight, health and breaker (read at scrape
time), route decisions by branch and by prediction source, digest failures, retries, streams
aborted by phase, migrations, TTFT and predicted vs reported cached tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.observability.metrics import LATENCY_BUCKETS

BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class _NodeCollector(Collector):
    def __init__(self, nodes: Callable[[], list[Any]]) -> None:
        self.nodes = nodes

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("hearth_gateway_node_in_flight", "Requests in flight per node", labels=["node"])
        up = GaugeMetricFamily("hearth_gateway_node_up", "1 if the node's liveness probe says up", labels=["node"])
        breaker = GaugeMetricFamily("hearth_gateway_node_breaker", "Breaker: 0 closed, 1 half-open, 2 open",
                                    labels=["node"])
        draining = GaugeMetricFamily("hearth_gateway_node_draining", "1 while the node drains", labels=["node"])
        lapsed = GaugeMetricFamily("hearth_gateway_node_lapsed",
                                   "1 while a node that joined has not renewed its registration", labels=["node"])
        for n in self.nodes():
            in_flight.add_metric([n.name], n.in_flight)
            up.add_metric([n.name], 1 if n.live.up else 0)
            breaker.add_metric([n.name], BREAKER_VALUE[n.breaker.state])
            draining.add_metric([n.name], 1 if n.draining else 0)
            lapsed.add_metric([n.name], 1 if n.lapsed else 0)
        yield from (in_flight, up, breaker, draining, lapsed)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("hearth_gateway_requests", "Requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.routes = Counter("hearth_gateway_route_decisions", "Route decisions by branch", ["branch"], registry=r)
        self.retries = Counter("hearth_gateway_retries", "Attempts retried on another node, by reason", ["reason"],
                               registry=r)
        self.aborted = Counter("hearth_gateway_streams_aborted", "Streams ended by an upstream failure, by phase",
                               ["phase"], registry=r)
        self.rejections = Counter("hearth_gateway_rejected", "Requests refused by admission, by reason", ["reason"],
                                  registry=r)
        self.health_changes = Counter("hearth_gateway_health_changes", "Liveness transitions", ["node", "to"],
                                      registry=r)
        self.migrations = Counter("hearth_gateway_migrations", "Sessions moved between nodes, by outcome",
                                  ["outcome"], registry=r)
        self.migration_seconds = Histogram("hearth_gateway_migration_seconds", "Time to move one session with its KV",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.stream_migrations = Counter("hearth_gateway_stream_migrations",
                                         "Streams whose node broke mid-answer, by what became of them: continued "
                                         "on another node, or ended with the terminal error (why)", ["outcome"],
                                         registry=r)
        self.stream_migration_seconds = Histogram("hearth_gateway_stream_migration_seconds",
                                                  "Added latency at a cut: the break to the continuation's first "
                                                  "event", buckets=LATENCY_BUCKETS, registry=r)
        self.transcripts_from_relay = Counter(
            "hearth_gateway_transcripts_from_relay",
            "Session turns recorded from the relayed answer: the node answered, then could not give its copy",
            registry=r)
        self.reprefills = Counter("hearth_gateway_session_reprefills",
                                  "Sessions continued on another node from the gateway's transcript", registry=r)
        self.ttft = Histogram("hearth_gateway_ttft_seconds", "Request start to the first byte sent to the client",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.predicted_cached = Counter("hearth_gateway_predicted_cached_tokens",
                                        "Cached prompt tokens the router predicted for the node it chose",
                                        registry=r)
        self.route_sources = Counter("hearth_gateway_route_sources",
                                     "Route decisions by what the cached-token prediction came from "
                                     "(digest: the nodes' digests; estimate: characters / 4 and what was sent where)",
                                     ["source"], registry=r)
        self.digest_failures = Counter("hearth_gateway_digest_failures",
                                       "Digest reads and blocks calls that gave nothing usable, by node and call",
                                       ["node", "call"], registry=r)
        self.reported_cached = Counter("hearth_gateway_reported_cached_tokens",
                                       "Cached prompt tokens the nodes reported", registry=r)
        self.reported_prompt = Counter("hearth_gateway_reported_prompt_tokens",
                                       "Prompt tokens the nodes reported, cached or not "
                                       "(Anthropic's input_tokens plus its cache reads and writes)", registry=r)
        self.waiting = Gauge("hearth_gateway_waiting_requests", "Requests in the wait queue", registry=r)

    def watch_nodes(self, nodes: Callable[[], list[Any]], waiting: Callable[[], int]) -> None:
        self.registry.register(_NodeCollector(nodes))
        self.waiting.set_function(lambda: float(waiting()))

    def route(self, branch: str) -> None:
        self.routes.labels(branch).inc()

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def health_change(self, node: str, up: bool) -> None:
        self.health_changes.labels(node, "up" if up else "down").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
