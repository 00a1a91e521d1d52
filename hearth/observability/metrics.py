"""Prometheus metrics, read from the engines at scrape time (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hearth.backends.local import LocalBackend


class EngineCollector(Collector):
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("hearth_running_sequences", "Requests decoding or prefilling",
                                    labels=["model"])
        waiting = GaugeMetricFamily("hearth_waiting_requests", "Requests queued for a slot", labels=["model"])
        kv = GaugeMetricFamily("hearth_kv_tokens", "Tokens held in the KV cache (all slots)", labels=["model"])
        counters = {
            name: CounterMetricFamily(f"hearth_{name}", doc, labels=["model"])
            for name, doc in (("prompt_tokens", "Prompt tokens prefilled"),
                              ("cached_tokens", "Prompt tokens reused from the KV cache"),
                              ("generated_tokens", "Tokens generated"),
                              ("engine_steps", "Engine steps (one llama_decode each)"),
                              ("requests_finished", "Requests finished, any reason"),
                              ("requests_cancelled", "Requests cancelled"))
        }
        for mid, e in self.backend.engines().items():
            running.add_metric([mid], e.running)
            waiting.add_metric([mid], e.waiting)
            kv.add_metric([mid], e.slots.kv_tokens)
            s = e.stats
            for name, value in (("prompt_tokens", s.prompt_tokens), ("cached_tokens", s.cached_tokens),
                                ("generated_tokens", s.generated_tokens), ("engine_steps", s.steps),
                                ("requests_finished", s.finished), ("requests_cancelled", s.cancelled)):
                counters[name].add_metric([mid], value)
        yield running
        yield waiting
        yield kv
        yield from counters.values()


def make_registry(backend: LocalBackend) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(EngineCollector(backend))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
